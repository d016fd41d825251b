"""Benchmarks behind `tracerl bench NAME`: each prints one JSON line with measured ratios and
`target_met`, measured side by side in one run (never timed assertions in tests)."""

from __future__ import annotations

import argparse


def run_benchmark(name: str, args: argparse.Namespace) -> int:
    if name == "concurrency":
        from tracerl.bench.concurrency import main as concurrency_main

        return concurrency_main(args)
    if name == "engine":
        from tracerl.bench.engine import main

        return main(args)
    if name == "faults":
        from tracerl.bench.faults import main as faults_main

        return faults_main(args)
    if name == "gae":
        from tracerl.bench.gae import main as gae_main

        return gae_main(args)
    if name == "gateway":
        from tracerl.bench.gateway import main as gateway_main

        return gateway_main(args)
    raise ValueError(f"unknown benchmark {name!r}")
