"""`tracerl bench gateway --backend vllm`: what the gateway adds per turn in front of vLLM.

Three processes on 127.0.0.1: a vLLM server (SmolLM2-135M, the CPU build here, launched as the
pool launches it), `tracerl gateway --engine.backend=vllm` in front of it, and this client.
Each session (6 turns, a ~60-token user message each, greedy, 16 tokens a reply) runs through
the gateway (OpenAI API, traced, committed to SQLite); then the same turns go straight to vLLM's
own `/inference/v1/generate` with the exact prompt ids the gateway recorded and the same number
of tokens to generate. vLLM's prefix cache is reset before each path's session, so both see the
same cache states turn by turn. The added latency of a turn is its gateway latency minus its
direct latency (paired: same prompt, same tokens); reported are the p50/p90 of those differences
and the p50s of both paths, one session at a time.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from tracerl import eventloop
from tracerl.bench.engine_vllm import _vllm_python
from tracerl.bench.gateway import session_via_gateway
from tracerl.config import EngineConfig
from tracerl.models import resolve_model
from tracerl.rollout.backends import free_port, launch_command
from tracerl.rollout.launcher import ProcessLauncher

TURNS = 6
REPLY_TOKENS = 16
TARGET_ADDED_P50_MS = 2.0
FILLER = "The river keeps flowing past the old mill while the committee reviews the figures. "


async def _reset_cache(http: aiohttp.ClientSession, vllm: str) -> None:
    async with http.post(f"{vllm}/reset_prefix_cache") as r:
        if r.status != 200:
            raise RuntimeError(f"reset_prefix_cache: {r.status} {await r.text()}")


async def _via_gateway(
    http: aiohttp.ClientSession, url: str, admin: str, k: int
) -> tuple[str, list[float]]:
    latencies: list[float] = []
    sid = await session_via_gateway(
        http, url, admin, k, latencies, turns=TURNS,
        user_text=lambda k, turn: f"Session {k} turn {turn}: " + FILLER * 4,
        sampling={"max_tokens": REPLY_TOKENS, "temperature": 0.0},
    )  # fmt: skip
    return sid, latencies


async def _direct(
    http: aiohttp.ClientSession, vllm: str, turns: list[dict[str, Any]]
) -> list[float]:
    latencies = []
    for turn in turns:
        body = {
            "request_id": secrets.token_hex(8),
            "token_ids": turn["prompt_ids"],
            "sampling_params": {
                "max_tokens": len(turn["completion_ids"]), "temperature": 0.0,
                "ignore_eos": True, "logprobs": 0, "detokenize": False,
            },
            "stream": False,
        }  # fmt: skip
        started = time.perf_counter()
        async with http.post(f"{vllm}/inference/v1/generate", json=body) as r:
            reply = await r.json()
            if r.status != 200:
                raise RuntimeError(f"vLLM turn failed: {reply}")
        latencies.append(time.perf_counter() - started)
    return latencies


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tracerl-bench-gateway-vllm-"))
    config = EngineConfig(
        backend="vllm", model=args.model, python=_vllm_python(args.engine_python),
        max_model_len=2048, kv_cache_tokens=32768,
    )  # fmt: skip
    port = free_port()
    argv, env = launch_command(config, resolve_model(args.model), port)
    vllm = f"http://127.0.0.1:{port}"
    engine = ProcessLauncher(argv, vllm, 900, env=env, log_path=tmp / "vllm.log", name="vLLM")
    admin = secrets.token_urlsafe(16)
    gateway_proc: ProcessLauncher | None = None
    added: list[float] = []
    via_all: list[float] = []
    direct_all: list[float] = []
    sessions = args.sessions_1 if args.sessions_1 != 20 else 10  # 20: the instant-engine default
    try:
        await engine.start()
        gateway_proc = ProcessLauncher(
            [sys.executable, "-m", "tracerl.cli.main", "gateway", "--model", args.model,
             "--engine-url", vllm, "--engine.backend=vllm", "--store", str(tmp / "t.sqlite"),
             "--port", "0", "--admin-key", admin],
            log_path=tmp / "gateway.log",
        )  # fmt: skip
        gateway = await gateway_proc.start()
        async with aiohttp.ClientSession() as http:
            await _via_gateway(http, gateway, admin, -1)  # warm-up, not counted
            for k in range(sessions):
                await _reset_cache(http, vllm)
                sid, via = await _via_gateway(http, gateway, admin, k)
                async with http.get(
                    f"{gateway}/sessions/{sid}", headers={"Authorization": f"Bearer {admin}"}
                ) as r:
                    trace = json.loads(await r.text())
                await _reset_cache(http, vllm)
                direct = await _direct(http, vllm, trace["turns"])
                added += [v - d for v, d in zip(via, direct, strict=True)]
                via_all += via
                direct_all += direct
    finally:
        if gateway_proc is not None:
            await gateway_proc.stop()
        await engine.stop()

    def pct(xs: list[float], q: int) -> float:
        return round(statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1000, 3)

    return {
        "benchmark": "gateway",
        "backend": "vllm",
        "model": args.model,
        "sessions": sessions,
        "turns": len(added),
        "reply_tokens": REPLY_TOKENS,
        "gateway_p50_ms": pct(via_all, 50),
        "direct_p50_ms": pct(direct_all, 50),
        "added_p50_ms": pct(added, 50),
        "added_p90_ms": pct(added, 90),
        "targets": {"added_p50_ms_max": TARGET_ADDED_P50_MS},
        "target_met": pct(added, 50) <= TARGET_ADDED_P50_MS,
    }


def main(args: argparse.Namespace) -> int:
    print(json.dumps(eventloop.run(_run(args))), flush=True)
    return 0
