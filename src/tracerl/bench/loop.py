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
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
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


async def _measure(steps: int, off_policy: int, seed: int) -> dict[str, Any]:
    from tracerl.run.loop import RLLoop

    with tempfile.TemporaryDirectory(prefix="tracerl-bench-loop-") as tmp:
        run_dir = Path(tmp)
        loop = RLLoop(_config(steps, off_policy), run_dir, engines=_engines(seed))
        started = time.monotonic()
        code = await loop.run()
        if code != 0:
            raise RuntimeError(f"the loop with max_off_policy_steps={off_policy} exited {code}")
        records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "time/step_s" in r]
    # the first step includes start-up and the first batch's ramp: time the steady steps
    timed = records[1:]
    seconds = sum(r["time/step_s"] for r in timed)
    return {
        "max_off_policy_steps": off_policy,
        "steps": len(records),
        "steps_per_hour": round(3600 * len(timed) / seconds, 1),
        "mean_step_s": round(seconds / len(timed), 2),
        "train_s_mean": round(sum(r["time/train_s"] for r in timed) / len(timed), 2),
        "staleness_max": max(int(r["rollout/staleness_max"]) for r in records),
        "stale_groups_dropped": int(records[-1].get("loop/groups_stale", 0)),
        "wall_s": round(time.monotonic() - started, 1),
    }


def main(args: argparse.Namespace) -> int:
    from tracerl.cli import loop

    steps = 4 if getattr(args, "quick", False) else 8
    sync = loop.run(_measure(steps, 0, seed=1))
    print(json.dumps({"mode": "sync", **sync}), flush=True)
    asynchronous = loop.run(_measure(steps, OFF_POLICY_BOUND, seed=1))
    print(json.dumps({"mode": "async", **asynchronous}), flush=True)
    ratio = asynchronous["steps_per_hour"] / sync["steps_per_hour"]
    result = {
        "benchmark": "loop",
        "sync_steps_per_hour": sync["steps_per_hour"],
        "async_steps_per_hour": asynchronous["steps_per_hour"],
        "async_vs_sync": round(ratio, 2),
        "async_staleness_max": asynchronous["staleness_max"],
        "targets": {"async_vs_sync_min": TARGET_RATIO, "staleness_max": OFF_POLICY_BOUND},
        "target_met": ratio >= TARGET_RATIO and asynchronous["staleness_max"] <= OFF_POLICY_BOUND,
    }
    print(json.dumps(result), flush=True)
    return 0
