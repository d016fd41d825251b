"""`tracerl bench gateway`: what the gateway adds per turn, against the same instant engine.

Three processes on 127.0.0.1: an instant fake engine (fixed 32-token answers), the gateway in
front of it, and this client. Sessions of 10 turns grow to about 4k tokens (each turn adds a
~350-token user message). The same sessions run through the gateway (OpenAI API, traced and
committed to SQLite) and then straight to the engine with the exact token ids the gateway
recorded, at 1 and at 64 concurrent sessions, in alternating rounds (this machine's speed drifts
between minutes). Reported: per-turn latency p50/p99 of both paths
and their difference (the added latency), and sustained turns/s of both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from tracerl import eventloop
from tracerl.rollout.launcher import ProcessLauncher

TURNS = 10
TARGET_ADDED_P50_MS = 2.0
TARGET_TURNS_PER_S = 500.0
FILLER = (
    "The quick brown fox jumps over the lazy dog while the committee reviews the "
    "quarterly figures and the river keeps flowing past the old mill. "
)


def _user_text(session: int, turn: int) -> str:
    return f"Session {session} turn {turn}: " + FILLER * 14  # ~350 tokens


async def session_via_gateway(
    http: aiohttp.ClientSession,
    url: str,
    admin: str,
    k: int,
    latencies: list[float],
    *,
    turns: int = TURNS,
    user_text: Callable[[int, int], str] = _user_text,
    sampling: dict[str, Any] | None = None,
) -> str:
    """One `turns`-turn OpenAI session through the gateway (each turn's latency appended to
    `latencies`); its session id. `sampling`: the body's sampling fields (64 tokens)."""
    async with http.post(f"{url}/sessions", headers={"Authorization": f"Bearer {admin}"}) as r:
        session = await r.json()
    key = {"Authorization": f"Bearer {session['api_key']}"}
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": user_text(k, turn)})
        body = {"model": "bench", "messages": messages, **(sampling or {"max_tokens": 64})}
        started = time.perf_counter()
        async with http.post(
            f"{session['openai_base_url']}/chat/completions", json=body, headers=key
        ) as r:
            reply = await r.json()
            if r.status != 200:
                raise RuntimeError(f"gateway turn failed: {reply}")
        latencies.append(time.perf_counter() - started)
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    return str(session["session_id"])


async def _session_direct(
    http: aiohttp.ClientSession, engine: str, prompts: list[list[int]], latencies: list[float]
) -> None:
    for ids in prompts:
        body = {
            "rid": secrets.token_hex(8),
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 64},
            "return_logprob": True,
        }
        started = time.perf_counter()
        async with http.post(f"{engine}/generate", json=body) as r:
            await r.json()
        latencies.append(time.perf_counter() - started)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from tracerl.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    answer = tokenizer(
        "The answer is forty-two, which follows from the figures above and the notes in the "
        "appendix; let me know if you need more.",
        add_special_tokens=False,
    )["input_ids"]
    reply_ids = [*answer[:31], tokenizer.eos_token_id]
    tmp = Path(tempfile.mkdtemp(prefix="tracerl-bench-gateway-"))
    admin = secrets.token_urlsafe(16)
    engine_proc = ProcessLauncher(
        [
            sys.executable,
            "-m",
            "tracerl.bench.instant_engine",
            "--reply-ids",
            ",".join(map(str, reply_ids)),
            "--eos-id",
            str(tokenizer.eos_token_id),
        ]
    )
    gateway_proc: ProcessLauncher | None = None
    results: dict[str, Any] = {}
    try:
        engine = await engine_proc.start()
        gateway_proc = ProcessLauncher(
            [
                sys.executable,
                "-m",
                "tracerl.cli.main",
                "gateway",
                "--model",
                args.model,
                "--engine-url",
                engine,
                "--store",
                str(tmp / "traces.sqlite"),
                "--port",
                "0",
                "--admin-key",
                admin,
            ]
        )
        gateway = await gateway_proc.start()
        connector = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=connector) as http:
            for label, concurrency, sessions, rounds in (
                ("s1", 1, args.sessions_1, 10),
                ("s64", 64, args.sessions_64, 2),
            ):
                results[label] = await _compare(
                    http, gateway, engine, admin, concurrency, sessions, rounds
                )
    finally:
        if gateway_proc is not None:
            await gateway_proc.stop()
        await engine_proc.stop()
    s1, s64 = results["s1"], results["s64"]
    return {
        "benchmark": "gateway",
        "turns_per_session": TURNS,
        "context_tokens_at_last_turn": s64.pop("last_prompt_tokens"),
        "s1": {k: v for k, v in s1.items() if k != "last_prompt_tokens"},
        "s64": s64,
        "targets": {
            "added_p50_ms_max": TARGET_ADDED_P50_MS,
            "turns_per_s_at_64_min": TARGET_TURNS_PER_S,
        },
        "target_met": s1["added_p50_ms"] <= TARGET_ADDED_P50_MS
        and s64["gateway_turns_per_s"] >= TARGET_TURNS_PER_S,
    }


async def _compare(
    http: aiohttp.ClientSession,
    gateway: str,
    engine: str,
    admin: str,
    concurrency: int,
    sessions: int,
    rounds: int,
) -> dict[str, Any]:
    """Alternate gateway and direct rounds (the machine's speed drifts between minutes)."""
    limit = asyncio.Semaphore(concurrency)
    via: list[float] = []
    direct: list[float] = []
    via_s = direct_s = 0.0
    longest = 0
    per_round = max(1, sessions // rounds)
    for r in range(rounds):

        async def one(k: int) -> str:
            async with limit:
                return await session_via_gateway(http, gateway, admin, k, via)

        started = time.perf_counter()
        ids = await asyncio.gather(*(one(r * per_round + k) for k in range(per_round)))
        via_s += time.perf_counter() - started
        prompts = []
        for sid in ids:
            async with http.get(
                f"{gateway}/sessions/{sid}", headers={"Authorization": f"Bearer {admin}"}
            ) as resp:
                trace = json.loads(await resp.text())
            prompts.append([t["prompt_ids"] for t in trace["turns"]])
        longest = max([longest, *(len(p[-1]) for p in prompts)])

        async def replay(p: list[list[int]]) -> None:
            async with limit:
                await _session_direct(http, engine, p, direct)

        started = time.perf_counter()
        await asyncio.gather(*(replay(p) for p in prompts))
        direct_s += time.perf_counter() - started
    turns = per_round * rounds * TURNS

    def pct(xs: list[float], q: int) -> float:
        return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1000

    return {
        "sessions": per_round * rounds,
        "turns": turns,
        "gateway_p50_ms": round(pct(via, 50), 3),
        "gateway_p99_ms": round(pct(via, 99), 3),
        "direct_p50_ms": round(pct(direct, 50), 3),
        "direct_p99_ms": round(pct(direct, 99), 3),
        "added_p50_ms": round(pct(via, 50) - pct(direct, 50), 3),
        "added_p99_ms": round(pct(via, 99) - pct(direct, 99), 3),
        "gateway_turns_per_s": round(turns / via_s, 1),
        "direct_turns_per_s": round(turns / direct_s, 1),
        "last_prompt_tokens": longest,
    }


def main(args: argparse.Namespace) -> int:
    print(json.dumps(eventloop.run(_run(args))), flush=True)
    return 0
