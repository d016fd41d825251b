"""Benchmarks behind `tracerl bench NAME`: each prints one JSON line with measured ratios and
`target_met`, measured side by side in one run (never timed assertions in tests)."""

from __future__ import annotations

import argparse
import importlib

# name -> module whose `main(args)` runs it (imported only when chosen: they pull in torch)
BENCHMARKS = {
    "engine": "tracerl.bench.engine",
    "gateway": "tracerl.bench.gateway",
    "gae": "tracerl.bench.gae",
    "faults": "tracerl.bench.faults",
    "concurrency": "tracerl.bench.concurrency",
    "loop": "tracerl.bench.loop",
    "train": "tracerl.bench.train",
    "learn": "tracerl.bench.learn",
}


def run_benchmark(name: str, args: argparse.Namespace) -> int:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    module = importlib.import_module(BENCHMARKS[name])
    if name == "train":  # it parses its own options (see `python -m tracerl.bench.train -h`)
        code: int = module.main(["--model", args.model, *(["--quick"] if args.quick else [])])
    else:
        code = module.main(args)
    return code
