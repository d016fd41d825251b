"""`tracerl bench scale`: steps per hour of the `tiny` loop (`examples/tiny.toml`) placed on a
local Ray cluster, with 1 or 2 trainer ranks and 1 or 2 engines, against the same run in one
process, side by side in one invocation; and the weight-sync time per step against model size.

Each run is the user's command (`tracerl train ... --cluster.backend=ray ...`) in a process of
its own, measured two ways from its `metrics.jsonl`: steady state (steps per hour between the
first and the last step, so start-up is excluded) and from process start (Ray's start, the
ranks' process group and model loading included). The Ray overhead is the steady-state ratio
of Ray with 1 rank and 1 engine to the in-process run at the same resources (target: at most 10 %
slower, ratio >= 0.9). On one machine more ranks or engines add no cores, so their figures show
what placement costs, not a speed-up.

Weight sync (`time/weight_sync_s`): on Ray the trainer ranks gather the actor, rank 0 puts it
in the object store and every engine actor writes it to its node and has its server reload it
(`_disk_sync`: rank 0 exports to the run directory instead); in process the embedded engine
takes the tensors in place. The `_gateway_agent_actors` run also places a gateway and an agent
worker as actors. `--model` is the second size (default `smollm2-135m`; not with `--quick`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracerl.run.metrics import read_metrics

TARGET_RATIO = 0.9
ROOT = Path(__file__).parents[3]
EXAMPLE = ROOT / "examples" / "tiny.toml"
CORES = os.cpu_count() or 1
# Equal resources: one rank computes on all the cores, as the in-process trainer does (torch's
# default); two ranks on one core each.
RAY = ["--cluster.backend=ray", "--cluster.num_cpus=8"]
ONE_RANK = [*RAY, f"--cluster.trainer.num_cpus={CORES}"]
TWO_RANKS = [*RAY, "--cluster.trainer.ranks=2", f"--cluster.trainer.num_cpus={max(1, CORES // 2)}"]
SETUPS: dict[str, list[str]] = {
    "in_process": [],
    "ray_1rank_1engine": ONE_RANK,
    "ray_1rank_1engine_disk_sync": [*ONE_RANK, "--cluster.weight_sync=disk"],
    "ray_1rank_1engine_gateway_agent_actors": [
        *ONE_RANK, "--cluster.gateways.count=1", "--cluster.agents.workers=1",
    ],
    "ray_2ranks_1engine": TWO_RANKS,
    "ray_1rank_2engines": [*ONE_RANK, "--engine.count=2"],
    "ray_2ranks_2engines": [*TWO_RANKS, "--engine.count=2"],
}  # fmt: skip
RUN_DEADLINE_S = 1800.0


def measure(name: str, extra: list[str], steps: int, root: Path, model: str) -> dict[str, Any]:
    run_dir = root / f"{name}-{model}"
    argv = [
        sys.executable, "-m", "tracerl.cli.main", "train", str(EXAMPLE), "--run-dir",
        str(run_dir), f"--loop.steps={steps}", "--logging.progress=false",
        f"--trainer.model={model}", "--loop.checkpoint_every=1000", *extra,
    ]  # fmt: skip
    started = time.monotonic()
    with open(root / f"{name}-{model}.log", "wb") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_DEADLINE_S)
    wall = time.monotonic() - started
    if code.returncode != 0:
        tail = (root / f"{name}-{model}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{name} ({model}) exited {code.returncode}:\n{tail}")
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "time/step_s" in r]
    first, last = records[0], records[-1]
    span = float(last["time/elapsed_s"]) - float(first["time/elapsed_s"])
    syncs = [float(r["time/weight_sync_s"]) for r in records]
    return {
        "setup": name,
        "model": model,
        "steps": len(records),
        "steps_per_hour": (len(records) - 1) / span * 3600 if span > 0 else None,
        "steps_per_hour_from_start": len(records) / wall * 3600,
        "wall_s": round(wall, 1),
        "startup_s": round(float(first["time/elapsed_s"]) - float(first["time/step_s"]), 1),
        "weight_sync_s_median": statistics.median(syncs),
        "train_s_median": statistics.median(float(r["time/train_s"]) for r in records),
    }


def main(args: argparse.Namespace) -> int:
    steps = 8 if args.quick else 30
    sizes = ["tiny"] if args.quick or args.model == "tiny" else ["tiny", args.model]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tracerl-bench-scale-") as tmp:
        for name, extra in SETUPS.items():
            results[name] = measure(name, extra, steps, Path(tmp), "tiny")
            print(json.dumps(results[name]), flush=True)
        sync: dict[str, dict[str, float]] = {}
        for model in sizes:
            for name in ("in_process", "ray_2ranks_2engines"):
                m = (
                    results[name]
                    if model == "tiny"
                    else measure(name, SETUPS[name], 4, Path(tmp), model)
                )
                if model != "tiny":
                    print(json.dumps(m), flush=True)
                sync.setdefault(model, {})[name] = m["weight_sync_s_median"]
    base = results["in_process"]["steps_per_hour"]
    ratios = {
        name: round(r["steps_per_hour"] / base, 3)
        for name, r in results.items()
        if name != "in_process"
    }
    summary = {
        "benchmark": "scale",
        "steps_per_run": steps,
        "steps_per_hour": {n: round(r["steps_per_hour"], 1) for n, r in results.items()},
        "steps_per_hour_from_start": {
            n: round(r["steps_per_hour_from_start"], 1) for n, r in results.items()
        },
        "ratio_to_in_process": ratios,
        "weight_sync_s": sync,
        "target": f"ray_1rank_1engine steady-state steps/hour >= {TARGET_RATIO} x in_process",
        "target_met": ratios["ray_1rank_1engine"] >= TARGET_RATIO,
    }
    print(json.dumps(summary), flush=True)
    return 0
