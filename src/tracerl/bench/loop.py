"""`tracerl bench loop`: steps per hour of the asynchronous loop (`max_off_policy_steps = 1`)
against the synchronous one (`0`), on the same rollout-bound workload, side by side in one run.

The whole `RLLoop` runs (gateway over HTTP, the `concise` environment through the openai SDK,
the trace store, the dispatcher and controller, the `tiny` trainer taking real steps, weight
pushes) with simulated engines in place of the embedded one: their timing is an inference
engine's (a step costs 20 ms plus 0.2 ms per running request; lognormal completion lengths with a
heavy tail), so rollouts dominate a step, as they do with real models. The synchronous loop waits
for every episode of a batch (the slowest decides) and idles the engines while it trains; the
asynchronous one keeps the next batch's episodes generating meanwhile. Reported: steps per hour
of each, their ratio, and the oldest trajectory the async run trained on (weight versions behind
its step), which must stay within the bound.

`--engine embedded` (also part of the default `both`) runs the real thing on this machine:
SmolLM2-135M-Instruct on the embedded engine and the trainer in one process, on the `medium`
task of `tracerl bench learn` (its generated config: 4 prompts x 8 samples, 12 new tokens), in
three ways: synchronous (`max_off_policy_steps = 0`: rollouts, then training), and asynchronous
with the engine paused while a step trains (`engines_while_training = "pause"`, what `auto`
picks when the trainer is on the CPU) or running beside it (`"run"`). Where the engine and the
trainer share the CPU cores, the asynchronous loop `auto` picks must not be slower than the
synchronous one (target: steps/hour ratio >= 1).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from tracerl.config import SimEngineConfig, TrainCommandConfig
from tracerl.run.metrics import read_metrics

TARGET_RATIO = 1.8
OFF_POLICY_BOUND = 1


def _config(steps: int, off_policy: int) -> TrainCommandConfig:
    return TrainCommandConfig.model_validate(
        {
            "trainer": {
                "model": "tiny",
                "algorithm": "grpo",
                "total_steps": steps,
                "token_budget": 4096,
                "actor": {"lr": 1e-5},
            },
            "env": {"name": "concise", "sampling": {"temperature": 1.0, "max_tokens": 1024}},
            "dataset": {"generate": "concise", "num_tasks": 512},
            "orchestrator": {
                "batch_size": 32,
                "group_size": 4,
                "concurrency": {"initial_inflight": 64, "min_inflight": 64, "max_inflight": 64},
            },
            "loop": {"steps": steps, "max_off_policy_steps": off_policy},
            "engine": {"model": "tiny", "max_model_len": 2048},
            "logging": {"progress": False},
        }
    )


def _engines(seed: int) -> dict[str, Any]:
    from tracerl.engine.sim import SimEngine

    config = SimEngineConfig(
        seed=seed,
        kv_cache_tokens=262_144,
        max_running_requests=256,
        max_model_len=2048,
        output_len_median=80.0,
        output_len_sigma=1.0,
        decode_step_s=0.02,
        decode_step_s_per_request=2e-4,
    )
    return {"sim": SimEngine(config)}


def _embedded_config(
    task_dir: Path, steps: int, off_policy: int, engines_while_training: str
) -> TrainCommandConfig:
    """The `medium` task's `tracerl bench learn` config, for `steps` steps and no evals."""
    from tracerl.bench.learn import tracerl_config

    text = tracerl_config(
        "grpo", task_dir / "train.jsonl", task_dir / "heldout.jsonl", seed=0, minutes=60.0
    )  # fmt: skip
    data = tomllib.loads(text)
    data["loop"].update(
        steps=steps, max_off_policy_steps=off_policy, engines_while_training=engines_while_training
    )
    return TrainCommandConfig.model_validate(data)


async def _measure(
    config: TrainCommandConfig, engines: dict[str, Any] | None, label: str
) -> dict[str, Any]:
    from tracerl.run.loop import RLLoop

    off_policy = config.loop.max_off_policy_steps
    with tempfile.TemporaryDirectory(prefix="tracerl-bench-loop-") as tmp:
        run_dir = Path(tmp) / "run"
        loop = RLLoop(config, run_dir, engines=engines)
        started = time.monotonic()
        code = await loop.run()
        if code != 0:
            raise RuntimeError(f"the loop ({label}) exited {code}")
        records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "time/step_s" in r]
    # the first step includes start-up and the first batch's ramp: time the steady steps
    timed = records[1:]
    seconds = sum(r["time/step_s"] for r in timed)
    return {
        "mode": label,
        "max_off_policy_steps": off_policy,
        "steps": len(records),
        "steps_per_hour": round(3600 * len(timed) / seconds, 1),
        "mean_step_s": round(seconds / len(timed), 2),
        "train_s_mean": round(sum(r["time/train_s"] for r in timed) / len(timed), 2),
        "staleness_max": max(int(r["rollout/staleness_max"]) for r in records),
        "stale_groups_dropped": int(records[-1].get("loop/groups_stale", 0)),
        "train_tokens": int(sum(r.get("perf/tokens", 0) for r in timed)),
        "weight_sync_s_mean": round(
            sum(r.get("time/weight_sync_s", 0) for r in timed) / len(timed), 2
        ),
        "wall_s": round(time.monotonic() - started, 1),
    }


def simulated(quick: bool) -> dict[str, Any]:
    """Sync against async over simulated engines (the inference-engine timing model)."""
    from tracerl import eventloop

    steps = 4 if quick else 8
    sync = eventloop.run(_measure(_config(steps, 0), _engines(1), "sync"))
    print(json.dumps({"engine": "sim", **sync}), flush=True)
    asynchronous = eventloop.run(_measure(_config(steps, OFF_POLICY_BOUND), _engines(1), "async"))
    print(json.dumps({"engine": "sim", **asynchronous}), flush=True)
    ratio = asynchronous["steps_per_hour"] / sync["steps_per_hour"]
    return {
        "sync_steps_per_hour": sync["steps_per_hour"],
        "async_steps_per_hour": asynchronous["steps_per_hour"],
        "async_vs_sync": round(ratio, 2),
        "async_staleness_max": asynchronous["staleness_max"],
        "targets": {"async_vs_sync_min": TARGET_RATIO, "staleness_max": OFF_POLICY_BOUND},
        "target_met": ratio >= TARGET_RATIO and asynchronous["staleness_max"] <= OFF_POLICY_BOUND,
    }


EMBEDDED_MODES = (("sync", 0, "pause"), ("async-pause", 1, "pause"), ("async-run", 1, "run"))


def embedded(quick: bool) -> dict[str, Any]:
    """The real model on the embedded engine: sync, async pausing the engine, async running."""
    from tracerl import eventloop
    from tracerl.bench.learn import write_task_files

    steps = 4 if quick else 12
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tracerl-bench-loop-tasks-") as tmp:
        task_dir = Path(tmp)
        write_task_files(task_dir, "medium")
        for label, off_policy, engines_while_training in EMBEDDED_MODES:
            config = _embedded_config(task_dir, steps, off_policy, engines_while_training)
            measured[label] = eventloop.run(_measure(config, None, label))
            print(json.dumps({"engine": "embedded", **measured[label]}), flush=True)
    rates = {label: m["steps_per_hour"] for label, m in measured.items()}
    ratio = rates["async-pause"] / rates["sync"]
    return {
        "model": "smollm2-135m",
        "steps_per_hour": rates,
        "async_pause_vs_sync": round(ratio, 2),
        "async_run_vs_sync": round(rates["async-run"] / rates["sync"], 2),
        "targets": {"async_pause_vs_sync_min": 1.0},
        "target_met": ratio >= 1.0,
    }


def main(args: argparse.Namespace) -> int:
    quick = bool(getattr(args, "quick", False))
    which = getattr(args, "engine", None) or "both"
    if which not in ("sim", "embedded", "both"):
        raise SystemExit(f"bench loop: --engine takes sim, embedded or both, got {which!r}")
    result: dict[str, Any] = {"benchmark": "loop"}
    if which in ("sim", "both"):
        result["sim"] = simulated(quick)
    if which in ("embedded", "both"):
        result["embedded"] = embedded(quick)
    result["target_met"] = all(
        part["target_met"] for key, part in result.items() if key in ("sim", "embedded")
    )
    print(json.dumps(result), flush=True)
    return 0
