"""`tracerl bench concurrency`: the adaptive controller against fixed caps on simulated engines.

Every configuration runs the real `Dispatcher`, `ConcurrencyController`, `MetricsCollector` and
`EnginePool` over in-process `SimEngine`s, on a virtual clock (`tracerl.bench.virtual_time`):
engine steps, idle gaps between turns, metric polls and the dispatcher's burst window all cost
simulated time, and the harness's own Python work costs none, so the figures measure the policy.

An episode is one or more turns; each turn resends the episode's growing context (prompt, the
previous completions, an observation per turn) and waits an idle gap before the next. A training
step completes every `batch_size` train episodes; with eval waves, `eval_episodes` eval episodes
(shorter answers) are submitted every `eval_every` steps and share the pool.

Each workload runs, for the same number of steps and seed: fixed caps 16, 64, 256 and 1024, and
the adaptive controller started low (16), high (1024) and bootstrapped (no initial cap). Reported
per configuration: generated tokens per simulated second, preemptions, mean queue wait (a turn's
request to its first token) and mean episode latency over the steps after the 10-step settling
allowance (whole-run totals alongside), and for adaptive runs the cap at each step and the step
from which it stayed in its steady-state range. One JSON line per workload, then a summary line.
Target, on every workload and start: throughput >= 95 % of the best fixed cap's, with no more
preemptions than that cap, settled within 10 steps.

One module of ~400 lines: the workloads, the fixed-cap and adaptive runs over them and the
summary are one experiment; each part is read only with the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tracerl.bench.virtual_time import run_virtual
from tracerl.config import ConcurrencyConfig, PoolConfig, SimEngineConfig
from tracerl.control.collector import MetricsCollector
from tracerl.control.controller import ConcurrencyController, Kind
from tracerl.control.dispatcher import Dispatcher, DispatcherClosed, Episode, Finished
from tracerl.engine.sim import SimEngine
from tracerl.engine.types import GenerateRequest, SamplingParams
from tracerl.rollout.pool import EnginePool, Member

FIXED_CAPS = (16, 64, 256, 1024)
ADAPTIVE_STARTS: dict[str, int | None] = {
    "adaptive_low": 16,
    "adaptive_high": 1024,
    "adaptive_bootstrap": None,
}
# Simulated seconds between metric polls (vLLM's Prometheus scrape is usually 1-5 s).
POLL_S = 2.0
# The cap has settled once it stays within its steady-state range widened by this share...
SETTLE_BAND = 0.1
# ...provided that range spans at most this ratio (one cut and one growth span 0.8-1.25x).
SETTLE_MAX_SPREAD = 2.0
TARGET_THROUGHPUT = 0.95
TARGET_SETTLE_STEPS = 10


@dataclass
class Workload:
    """One benchmark scenario; a `--workload` JSON file holds one object (or a list) of these
    fields. Ranges are `[low, high]`, drawn uniformly per episode or turn."""

    name: str
    engines: int = 2
    kv_cache_tokens: int = 60_000
    max_running_requests: int = 1024
    decode_step_s: float = 0.02
    decode_step_s_per_request: float = 2e-4
    prefill_s_per_token: float = 2e-5
    prompt_tokens: tuple[int, int] = (100, 300)
    output_median: float = 100.0
    output_sigma: float = 0.3
    max_new_tokens: int = 4096
    turns: tuple[int, int] = (1, 1)
    observation_tokens: tuple[int, int] = (50, 150)
    gap_s: tuple[float, float] = (0.0, 0.0)
    batch_size: int = 64
    group_size: int = 8
    steps: int = 20
    eval_every: int = 0
    eval_episodes: int = 0
    eval_max_new_tokens: int = 64
    measure_from: int = TARGET_SETTLE_STEPS
    """Throughput, preemptions, waits and latencies are measured over the steps after this one
    (the settling allowance); totals over the whole run are reported alongside."""

    @classmethod
    def from_json(cls, spec: dict[str, Any], source: str) -> Workload:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(
                f"{source}: unknown workload field(s) {unknown}; known: {sorted(known)}"
            )
        if "name" not in spec:
            raise ValueError(f"{source}: a workload needs a 'name'")
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()
        }
        workload = cls(**values)
        if workload.batch_size % workload.group_size:
            raise ValueError(f"{source}: batch_size must be divisible by group_size")
        if not 0 <= workload.measure_from < workload.steps:
            raise ValueError(f"{source}: measure_from must be in [0, steps)")
        return workload


BUILTIN = [
    Workload("short_single_turn"),
    Workload(
        "long_heavy_tailed",
        prompt_tokens=(200, 600),
        output_median=300.0,
        output_sigma=1.0,
        steps=30,  # heavy tails: 20 measured steps for a mean that is not one outlier's
    ),
    Workload(
        "agentic_multi_turn",
        turns=(2, 6),
        output_median=60.0,
        gap_s=(0.5, 3.0),
        batch_size=32,
    ),
    Workload("train_with_eval_waves", eval_every=3, eval_episodes=128),
    Workload(
        "agents_growing_context",  # tool calls answered fast, big observations: each episode's
        turns=(6, 12),  # context grows in place to several thousand tokens
        output_median=80.0,
        observation_tokens=(300, 900),
        gap_s=(0.05, 0.3),
        batch_size=32,
    ),
]


@dataclass
class RunResult:
    """Figures over the measured steps (after the settling allowance), totals alongside."""

    config: str
    tokens_per_s: float
    preemptions: int
    queue_wait_s: float
    episode_latency_s: float
    total_tokens_per_s: float
    total_preemptions: int
    elapsed_s: float
    settled_step: int | None = None
    caps: list[int] = field(default_factory=list)


def settled_step(caps: list[int], measure_from: int) -> int | None:
    """The first step from which the cap stays in its steady-state range: the range the caps
    span over the measured steps, widened by SETTLE_BAND (an AIMD controller keeps probing, so
    steady state is a sawtooth, not a constant). None when that range itself spans more than
    SETTLE_MAX_SPREAD: the cap is still trending or swinging, not settled."""
    measured = caps[measure_from:] or caps
    low, high = min(measured), max(measured)
    if high > SETTLE_MAX_SPREAD * low:
        return None
    settled = len(caps)
    for i in range(len(caps) - 1, -1, -1):
        if not low * (1 - SETTLE_BAND) <= caps[i] <= high * (1 + SETTLE_BAND):
            break
        settled = i + 1
    return settled


async def _run(workload: Workload, mode: str, seed: int) -> RunResult:
    w = workload
    sims = [
        SimEngine(
            SimEngineConfig(
                seed=seed + i,
                kv_cache_tokens=w.kv_cache_tokens,
                max_running_requests=w.max_running_requests,
                max_model_len=32_768,
                decode_step_s=w.decode_step_s,
                decode_step_s_per_request=w.decode_step_s_per_request,
                prefill_s_per_token=w.prefill_s_per_token,
                output_len_median=w.output_median,
                output_len_sigma=w.output_sigma,
            )
        )
        for i in range(w.engines)
    ]
    pool = EnginePool(
        [Member(f"sim{i}", s) for i, s in enumerate(sims)],
        PoolConfig(request_timeout_s=3600, health_interval_s=3600),
    )
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    if mode.startswith("fixed_"):
        cap = int(mode.removeprefix("fixed_"))
        concurrency = ConcurrencyConfig(initial_inflight=cap, min_inflight=cap, max_inflight=cap)
        adaptive = False
    else:
        concurrency = ConcurrencyConfig(initial_inflight=ADAPTIVE_STARTS[mode])
        adaptive = True
    waits: list[tuple[float, float]] = []  # (when, request-to-first-token)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(3, 49152) for _ in range(count)]

    async def episode(ep: Episode) -> tuple[None, int]:
        # each turn resends the whole context: prompt, every completion, every observation
        context = tokens(rng.randint(*w.prompt_tokens))
        budget = w.eval_max_new_tokens if ep.kind == "eval" else w.max_new_tokens
        held = 0  # its cost: the most KV it held (the whole context of its last turn)
        turns = rng.randint(*w.turns)
        for turn in range(turns):
            request = GenerateRequest(
                rid=f"{ep.episode_id}-{turn}",
                input_ids=context,
                sampling_params=SamplingParams(max_new_tokens=budget),
            )
            asked, first = loop.time(), True
            context = list(context)
            async for chunk in pool.generate_stream(request):
                if first:
                    waits.append((loop.time(), loop.time() - asked))
                    first = False
                context += chunk.output_ids
            held = max(held, len(context))
            if turn + 1 < turns:
                context += tokens(rng.randint(*w.observation_tokens))
                await asyncio.sleep(rng.uniform(*w.gap_s))
        return None, held

    controller: ConcurrencyController | None = None
    done_train: list[Finished] = []
    completed = asyncio.Event()

    def on_complete(result: Finished) -> None:
        if controller is not None:
            kind: Kind = "eval" if result.episode.kind == "eval" else "train"
            controller.on_episode_complete(
                result.episode.env, kind, result.tokens, result.duration_s, loop.time()
            )
        if result.episode.kind == "train" and result.tokens > 0:
            done_train.append(result)
            completed.set()

    dispatcher = Dispatcher(
        episode,
        cap=concurrency.initial_inflight or 1,
        group_size=w.group_size,
        on_complete=on_complete,
        clock=loop.time,
    )
    if adaptive:
        controller = ConcurrencyController(
            concurrency,
            set_limit=dispatcher.set_limit,
            on_overload=dispatcher.shed,
            get_inflight=lambda: dispatcher.inflight,
            get_eval_share=dispatcher.eval_share,
        )
    collector = MetricsCollector(
        {f"sim{i}": s for i, s in enumerate(sims)},
        controller.observe if controller is not None else (lambda samples, now: None),
        interval_s=POLL_S,
    )
    counter = 0
    eval_backlog = 0  # eval waves go first: an orchestrator must not starve them behind train

    async def feed() -> None:
        nonlocal counter, eval_backlog
        while True:
            kind = "eval" if eval_backlog else "train"
            group = counter // w.group_size
            if kind == "eval":  # a group of its own, even where a wave splits a train group
                group = -1 - group
            try:
                await dispatcher.submit(Episode(f"{kind}{counter}", group, kind=kind))
            except DispatcherClosed:
                return
            if kind == "eval":
                eval_backlog -= 1
            counter += 1

    if adaptive and concurrency.initial_inflight is None:
        await collector.poll_once()  # the bootstrap needs one look at the engines first
    collector.start()
    feeder = asyncio.create_task(feed())
    caps: list[int] = []
    marks = [(0.0, 0, 0)]  # (time, generated, preemptions) at each step boundary
    steps = 0
    try:
        while steps < w.steps:
            completed.clear()
            await completed.wait()
            while steps < w.steps and len(done_train) >= (steps + 1) * w.batch_size:
                steps += 1
                if controller is not None:
                    controller.on_step()
                caps.append(dispatcher.cap)
                stats_now = [s.stats() for s in sims]
                marks.append(
                    (
                        loop.time(),
                        sum(x.generation_tokens_total for x in stats_now),
                        sum(x.preemptions_total for x in stats_now),
                    )
                )
                if w.eval_every and steps % w.eval_every == 0:
                    eval_backlog += w.eval_episodes
        elapsed = loop.time()
    finally:
        await collector.stop()
        await dispatcher.close()  # stops the feeders' admissions and ends what runs
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
        await pool.close()
    for sim in sims:
        await sim.close()
    start_at, start_gen, start_pre = marks[min(w.measure_from, len(marks) - 1)]
    end_at, end_gen, end_pre = marks[-1]
    window_waits = [wait for at, wait in waits if at > start_at]
    latencies = [r.duration_s for r in done_train[w.measure_from * w.batch_size :]]
    result = RunResult(
        mode,
        tokens_per_s=round((end_gen - start_gen) / max(1e-9, end_at - start_at), 1),
        preemptions=end_pre - start_pre,
        queue_wait_s=round(sum(window_waits) / max(1, len(window_waits)), 3),
        episode_latency_s=round(sum(latencies) / max(1, len(latencies)), 2),
        total_tokens_per_s=round(end_gen / elapsed, 1),
        total_preemptions=end_pre,
        elapsed_s=round(elapsed, 1),
    )
    if adaptive:
        result.caps = caps
        result.settled_step = settled_step(caps, w.measure_from)
    return result


def _modes() -> list[str]:
    return [*(f"fixed_{c}" for c in FIXED_CAPS), *ADAPTIVE_STARTS]


def run_workload(workload: Workload, seed: int = 7) -> dict[str, Any]:
    started = time.monotonic()
    runs = [run_virtual(_run(workload, mode, seed)) for mode in _modes()]
    fixed = [r for r in runs if r.config.startswith("fixed_")]
    best = max(fixed, key=lambda r: r.tokens_per_s)
    adaptive = [r for r in runs if not r.config.startswith("fixed_")]
    verdicts = {
        r.config: {
            "throughput_vs_best_fixed": round(r.tokens_per_s / best.tokens_per_s, 3),
            "preemptions_vs_best_fixed": [r.preemptions, best.preemptions],
            "settled_step": r.settled_step,
            "met": r.tokens_per_s >= TARGET_THROUGHPUT * best.tokens_per_s
            and r.preemptions <= best.preemptions
            and r.settled_step is not None
            and r.settled_step <= TARGET_SETTLE_STEPS,
        }
        for r in adaptive
    }
    return {
        "benchmark": "concurrency",
        "workload": workload.name,
        "steps": workload.steps,
        "runs": [{k: v for k, v in asdict(r).items() if v is not None and v != []} for r in runs],
        "best_fixed": best.config,
        "adaptive": verdicts,
        "targets": {
            "throughput_vs_best_fixed_min": TARGET_THROUGHPUT,
            "preemptions_max": "the best fixed cap's",
            "settled_within_steps": TARGET_SETTLE_STEPS,
        },
        "target_met": all(v["met"] for v in verdicts.values()),
        "wall_s": round(time.monotonic() - started, 1),
    }


def load_workloads(path: str) -> list[Workload]:
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--workload {path}: {e}") from e
    specs = spec if isinstance(spec, list) else [spec]
    if not all(isinstance(s, dict) for s in specs):
        raise ValueError(f"--workload {path}: expected an object or a list of objects")
    return [Workload.from_json(s, f"{path}[{i}]") for i, s in enumerate(specs)]


def main(args: argparse.Namespace) -> int:
    workloads = load_workloads(args.workload) if getattr(args, "workload", None) else BUILTIN
    if getattr(args, "quick", False):
        workloads = [Workload(**{**asdict(w), "steps": 8, "measure_from": 4}) for w in workloads]
    lines = []
    for workload in workloads:
        line = run_workload(workload)
        lines.append(line)
        print(json.dumps(line), flush=True)
    summary = {
        "benchmark": "concurrency",
        "workloads": {
            line["workload"]: {
                name: v["throughput_vs_best_fixed"] for name, v in line["adaptive"].items()
            }
            for line in lines
        },
        "targets": lines[0]["targets"] if lines else {},
        "target_met": all(line["target_met"] for line in lines),
    }
    print(json.dumps(summary), flush=True)
    return 0
