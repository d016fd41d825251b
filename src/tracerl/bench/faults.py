"""The fault soak: multi-turn sessions through the gateway and the engine pool over three
launched simulated engines that crash, hang and talk nonsense.

`run_soak` is shared by the soak test and `tracerl bench faults`. Every session either completes
with a full trace or is reported failed with a reason; the function counts what would be a bug:
sessions lost (no answer at all), turns recorded twice or not at all, and success responses
without a recorded turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tracerl.config import PoolConfig

# Each engine gets its own kind of trouble; together they exercise every recovery path.
FAULTS = [
    ["--sim.faults.crash_at_s=3"],  # the process exits every 3 s of its life
    ["--sim.faults.hang_after_requests=120"],  # stops answering, is detected and restarted
    [
        "--sim.faults.malformed_rate=0.03",
        "--sim.faults.error_rate=0.02",
        "--sim.faults.oov_rate=0.05",
    ],
]
SIM = [
    "--sim.output_len_median=12",
    "--sim.output_len_sigma=0.5",
    "--sim.decode_step_s=0.004",
    "--sim.decode_step_s_per_request=0.0001",
]


@dataclass
class SoakResult:
    sessions: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    turns_ok: int = 0
    turns_recorded: int = 0
    duplicated_or_missing: int = 0
    success_without_record: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    pool: dict[str, int] = field(default_factory=dict)
    detect_s: list[float] = field(default_factory=list)


async def run_soak(
    sessions: int = 500,
    turns: int = 3,
    faults: bool = True,
    concurrency: int = 64,
    timeout_s: float = 300.0,
) -> SoakResult:
    from transformers import AutoTokenizer

    from tracerl.engine.server import start_server
    from tracerl.engine.sim import sim_engine_command
    from tracerl.gateway.server import Gateway
    from tracerl.gateway.store import SQLiteTraceStore
    from tracerl.models import resolve_model
    from tracerl.rollout.launcher import ProcessLauncher
    from tracerl.rollout.pool import EnginePool

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    launchers = [
        ProcessLauncher(sim_engine_command(*SIM, *(f if faults else []), f"--sim.seed={i}"))
        for i, f in enumerate(FAULTS)
    ]
    config = PoolConfig(
        health_interval_s=0.25,
        health_timeout_s=0.5,
        failure_threshold=2,
        request_timeout_s=2.0,
        max_attempts=6,
        no_engine_wait_s=20.0,
    )
    pool = await EnginePool.launch(launchers, config=config)
    await pool.start()
    tmp = Path(tempfile.mkdtemp(prefix="tracerl-soak-"))
    store = SQLiteTraceStore(tmp / "traces.sqlite")
    gateway = Gateway(pool, tokenizer, store, model_name="tiny", eos_ids={2}, admin_key="soak")
    runner, port = await start_server(gateway.app(), "127.0.0.1", 0, cancel_on_disconnect=False)
    url = f"http://127.0.0.1:{port}"
    result = SoakResult(sessions=sessions)
    outcomes: dict[str, int] = {}
    limit = asyncio.Semaphore(concurrency)
    started = time.monotonic()

    async def session(http: aiohttp.ClientSession, k: int) -> None:
        async with limit:
            async with http.post(f"{url}/sessions", headers={"Authorization": "Bearer soak"}) as r:
                s = await r.json()
            key = {"Authorization": f"Bearer {s['api_key']}"}
            messages: list[dict[str, Any]] = []
            ok = 0
            for t in range(turns):
                messages.append({"role": "user", "content": f"session {k} turn {t}"})
                async with http.post(
                    f"{s['openai_base_url']}/chat/completions",
                    headers=key,
                    json={"model": "tiny", "messages": messages, "max_tokens": 24},
                ) as r:
                    body = await r.json()
                if r.status != 200:
                    reason = f"HTTP {r.status}"
                    result.failure_reasons[reason] = result.failure_reasons.get(reason, 0) + 1
                    result.failed += 1
                    break
                ok += 1
                messages.append(
                    {"role": "assistant", "content": body["choices"][0]["message"]["content"] or ""}
                )
            else:
                result.completed += 1
            outcomes[s["session_id"]] = ok

    try:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            tasks = [asyncio.create_task(session(http, k)) for k in range(sessions)]
            done, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
            result.lost = len(pending) + sum(1 for t in done if t.exception() is not None)
        result.seconds = time.monotonic() - started
        for sid, ok in outcomes.items():
            recorded = len(await store.turns(sid))
            result.turns_ok += ok
            result.turns_recorded += recorded
            result.duplicated_or_missing += abs(recorded - ok)
            result.success_without_record += max(0, ok - recorded)
        result.pool = dict(pool.counters)
        result.detect_s = list(pool.detection_s)
    finally:
        await runner.cleanup()
        await store.close()
        await pool.close()
    return result


def main(args: argparse.Namespace) -> int:
    from tracerl import eventloop

    faulty = eventloop.run(run_soak(sessions=args.sessions))
    clean = eventloop.run(run_soak(sessions=faulty.sessions, faults=False))
    detect = faulty.detect_s
    out = {
        "benchmark": "faults",
        "sessions": faulty.sessions,
        "completed": faulty.completed,
        "failed": faulty.failed,
        "failure_reasons": faulty.failure_reasons,
        "lost": faulty.lost,
        "turns_ok": faulty.turns_ok,
        "turns_recorded": faulty.turns_recorded,
        "duplicated_or_missing_turns": faulty.duplicated_or_missing,
        "success_without_record": faulty.success_without_record,
        "retries": faulty.pool.get("retries", 0),
        "resumes": faulty.pool.get("resumes", 0),
        "restarts": faulty.pool.get("restarts", 0),
        "deactivations": faulty.pool.get("deactivated", 0),
        "mean_detect_s": round(sum(detect) / len(detect), 3) if detect else None,
        "turns_per_s": round(faulty.turns_ok / faulty.seconds, 1),
        "turns_per_s_no_faults": round(clean.turns_ok / clean.seconds, 1),
        "throughput_vs_no_faults": round(
            (faulty.turns_ok / faulty.seconds) / (clean.turns_ok / clean.seconds), 3
        ),
        "target_met": faulty.lost == 0
        and faulty.duplicated_or_missing == 0
        and faulty.success_without_record == 0,
    }
    print(json.dumps(out), flush=True)
    return 0
