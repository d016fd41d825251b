"""`tracerl bench engine`: the embedded engine against transformers' `generate()`.

Same model object, prompts, sampling settings (temperature 0.7, no top-p/top-k) and output lengths
on both sides, in one run:
- 1 concurrent request: requests one after another; `generate()` gets each request alone.
- 16 concurrent requests: a stream of requests with output lengths spread 10x, at most 16 in
  flight. The engine refills its batch as requests finish; `generate()` takes them 16 at a time,
  each batch left-padded and run to its longest output (EOS disabled on both sides so every request
  produces exactly its length).

`--forward both` also runs the generic path (the model's own forward, one sequence at a time:
`tracerl.engine.generic`) on the same work in the same rounds, beside the slot cache.

Throughput counts requested tokens only (what a caller receives) per wall-clock second. Both
sides run in this process on the same model object; the engine is driven through its Python API
(the HTTP layer adds well under a millisecond per request).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from tracerl.config import EngineConfig
from tracerl.engine.local import LocalEngine
from tracerl.engine.protocol import Engine
from tracerl.engine.types import GenerateRequest, SamplingParams
from tracerl.models import load_model_and_tokenizer

TEMPERATURE = 0.7
TARGET_C16 = 1.5
TARGET_C1 = 0.9
QUESTIONS = [
    "Explain why the sky is blue.",
    "Write a short poem about autumn leaves falling in a quiet park.",
    "What is 17 times 23?",
    "List three uses of a paperclip.",
    "Describe how a bicycle works to a child who has never seen one before.",
    "Translate 'good morning' into French, Spanish and German.",
    "Why do cats purr?",
    "Summarise the plot of a detective story in two sentences, including the twist at the end.",
]


def workload(tokenizer: Any, n: int, lengths: tuple[int, int], seed: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = list(ids["input_ids"])
        out.append((ids, rng.randint(*lengths)))
    return out


def _hf_generate(model: Any, tokenizer: Any, batch: list[tuple]) -> int:
    """One `generate()` call over `batch`, left-padded, run to the longest requested length."""
    width = max(len(ids) for ids, _ in batch)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _ in batch])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in batch])
    longest = max(n for _, n in batch)
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=True,
            temperature=TEMPERATURE,
            top_k=0,
            top_p=1.0,
            max_new_tokens=longest,
            min_new_tokens=longest,
            pad_token_id=pad,
        )
    assert out.shape[1] - width == longest
    return sum(n for _, n in batch)


def _run_generate(model: Any, tokenizer: Any, work: list[tuple], concurrency: int) -> float:
    started = time.perf_counter()
    tokens = 0
    for i in range(0, len(work), concurrency):
        tokens += _hf_generate(model, tokenizer, work[i : i + concurrency])
    return tokens / (time.perf_counter() - started)


async def run_engine(engine: Engine, work: list[tuple], concurrency: int, tag: str = "") -> float:
    """Requested tokens/s of `engine` over `work` at `concurrency` (request ids `TAGi-r`)."""
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int, ids: list[int], n: int) -> int:
        async with limit:
            req = GenerateRequest(
                rid=f"{tag}{i}-r",
                input_ids=ids,
                sampling_params=SamplingParams(
                    max_new_tokens=n, temperature=TEMPERATURE, ignore_eos=True, seed=i
                ),
            )
            out = await engine.generate(req)
            assert len(out.output_ids) == n, (len(out.output_ids), n)
            return n

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(i, ids, n) for i, (ids, n) in enumerate(work)))
    return sum(counts) / (time.perf_counter() - started)


@dataclass
class _Totals:
    tokens: int = 0
    engine_s: float = 0.0
    generate_s: float = 0.0
    generic_s: float = 0.0
    round_ratios: list[float] = field(default_factory=list)


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(args.model)
    lengths = (8, 80) if args.quick else (16, 160)
    n_seq, n_conc = (3, 32) if args.quick else (4, args.requests)
    rounds = args.rounds if args.rounds is not None else 2
    both = args.forward == "both"
    forward = "slots" if both else args.forward

    def engine_for(path: str) -> LocalEngine:
        config = EngineConfig.model_validate(
            {"model": args.model, "max_running_requests": 16, "forward": path}
        )
        return LocalEngine(config, model=model, tokenizer=tokenizer)

    engine = engine_for(forward)
    generic = engine_for("generic") if both else None
    totals = {label: _Totals() for label in ("c1", "c16")}
    async with contextlib.AsyncExitStack() as stack:
        for started in (engine, generic):
            if started is not None:
                await stack.enter_async_context(started)
        warm = workload(tokenizer, 1, (8, 8), seed=0)
        await run_engine(engine, warm, 1)
        if generic is not None:
            await run_engine(generic, warm, 1, tag="g")
        _run_generate(model, tokenizer, warm, 1)
        # Rounds alternate the two sides so both see the same machine conditions (memory
        # bandwidth here varies by +-20 % between minutes); figures are totals over rounds.
        for round_index in range(rounds):
            for label, n, conc in (("c1", n_seq, 1), ("c16", n_conc, 16)):
                work = workload(tokenizer, n, lengths, seed=100 * round_index + conc)
                tokens = sum(k for _, k in work)
                engine_s = tokens / await run_engine(engine, work, conc)
                generate_s = tokens / _run_generate(model, tokenizer, work, conc)
                t = totals[label]
                if generic is not None:
                    t.generic_s += tokens / await run_engine(generic, work, conc, tag="g")
                t.tokens += tokens
                t.engine_s += engine_s
                t.generate_s += generate_s
                t.round_ratios.append(round(generate_s / engine_s, 3))
        stats = engine.stats()
    results: dict[str, Any] = {}
    for label, t in totals.items():
        results[label] = {
            "tokens": t.tokens,
            "engine_tokens_per_s": round(t.tokens / t.engine_s, 2),
            "generate_tokens_per_s": round(t.tokens / t.generate_s, 2),
            "ratio": round(t.generate_s / t.engine_s, 3),
            "round_ratios": t.round_ratios,
        }
        if both:
            results[label]["generic_tokens_per_s"] = round(t.tokens / t.generic_s, 2)
            results[label]["slots_vs_generic"] = round(t.generic_s / t.engine_s, 3)
    return {
        "benchmark": "engine",
        "model": args.model,
        "forward": args.forward,
        "runner": type(engine.runner).__name__,
        "threads": torch.get_num_threads(),
        "output_lengths": list(lengths),
        "rounds": rounds,
        **results,
        "preemptions": stats.preemptions_total,
        "targets": {"c16_ratio_min": TARGET_C16, "c1_ratio_min": TARGET_C1},
        "target_met": results["c16"]["ratio"] >= TARGET_C16 and results["c1"]["ratio"] >= TARGET_C1,
    }


def main(args: argparse.Namespace) -> int:
    result = asyncio.run(_measure(args))
    print(json.dumps(result), flush=True)
    return 0
