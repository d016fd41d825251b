"""Benchmarks behind `tracerl bench NAME`: each prints one JSON line with measured ratios and
`target_met`, measured side by side in one run (never timed assertions in tests).

Owns the performance targets and the harnesses that check them. Must not be imported by the
framework's packages, nor import the CLI (`tracerl.eventloop` runs them)."""

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
    "lora": "tracerl.bench.lora",
    "step": "tracerl.bench.step",
    "scale": "tracerl.bench.scale",
    "store": "tracerl.bench.store",
    "view": "tracerl.bench.view",
    "moe": "tracerl.bench.moe",
}

VLLM_VARIANTS = {"engine": "tracerl.bench.engine_vllm", "gateway": "tracerl.bench.gateway_vllm"}


def run_benchmark(name: str, args: argparse.Namespace) -> int:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    module_name = BENCHMARKS[name]
    if getattr(args, "backend", "local") == "vllm" and name != "learn":  # learn: its own option
        if name not in VLLM_VARIANTS:
            raise ValueError(f"bench {name} has no --backend vllm variant")
        module_name = VLLM_VARIANTS[name]
    module = importlib.import_module(module_name)
    if name in ("train", "step"):  # they parse their own options (`python -m MODULE -h`)
        argv = ["--model", args.model, *(["--quick"] if args.quick else [])]
        if args.rounds is not None:
            argv += ["--rounds", str(args.rounds)]
        if name == "step" and args.autocast:
            argv.append("--autocast")
        code: int = module.main(argv)
    elif name == "lora":  # its own options too; --minutes and --work-dir are learn's
        argv = ["--minutes", str(args.minutes), *(["--quick"] if args.quick else [])]
        code = module.main(argv + (["--work-dir", args.work_dir] if args.work_dir else []))
    else:
        code = module.main(args)
    return code
