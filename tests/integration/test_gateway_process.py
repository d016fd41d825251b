"""`tracerl gateway` as a process: committed turns survive `kill -9`, and a restarted gateway
continues the same session on the same store."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import aiohttp

from tracerl.gateway.store import SQLiteTraceStore

ADMIN = "test-admin-key"


async def start_gateway(
    engine_url: str, store: str, extra: list[str] | None = None
) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracerl.cli.main",
            "gateway",
            "--model",
            "tiny",
            "--engine-url",
            engine_url,
            "--store",
            store,
            "--port",
            "0",
            "--admin-key",
            ADMIN,
            *(extra or []),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(proc.stdout.readline)
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        if match:
            return proc, match.group(0)
        if not line:
            break
    proc.kill()
    raise AssertionError(f"gateway did not start: {proc.stderr.read() if proc.stderr else ''}")


async def test_committed_turns_survive_kill_9(fake_engine, tmp_path) -> None:
    fake, engine = fake_engine
    store_path = str(tmp_path / "traces.sqlite")
    proc, url = await start_gateway(engine.base_url, store_path)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/sessions", headers=headers) as r:
                session = await r.json()
            key = {"Authorization": f"Bearer {session['api_key']}"}
            messages = [{"role": "user", "content": "start"}]
            answers = []
            for k in range(5):
                fake.say(f"answer number {k}")
                body = {"model": "tiny", "messages": messages, "stream": k % 2 == 1}
                async with http.post(
                    f"{session['openai_base_url']}/chat/completions", json=body, headers=key
                ) as r:
                    assert r.status == 200
                    await r.read()
                answers.append(f"answer number {k}")
                messages = [
                    *messages,
                    {"role": "assistant", "content": answers[-1]},
                    {"role": "user", "content": f"more {k}"},
                ]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    store = SQLiteTraceStore(store_path)
    trace = await store.trace(session["session_id"])
    assert trace is not None and len(trace.turns) == 5
    assert [t.parent for t in trace.turns] == [None, 0, 1, 2, 3]
    assert len(trace.trajectories) == 1
    await store.close()

    # A new gateway on the same store continues the session's numbering.
    proc, url = await start_gateway(engine.base_url, store_path)
    try:
        async with aiohttp.ClientSession() as http:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "again"}]}
            base = f"{url}/s/{session['session_id']}/v1"
            key = {"Authorization": f"Bearer {session['api_key']}"}
            async with http.post(f"{base}/chat/completions", json=body, headers=key) as r:
                assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    store = SQLiteTraceStore(store_path)
    turns = await store.turns(session["session_id"])
    assert [t.index for t in turns] == [0, 1, 2, 3, 4, 5]
    await store.close()


async def test_a_given_admin_key_is_never_printed_in_full(fake_engine, tmp_path) -> None:
    _, engine = fake_engine
    proc, _ = await start_gateway(engine.base_url, str(tmp_path / "traces.sqlite"))
    try:
        assert proc.stdout is not None
        lines = [await asyncio.to_thread(proc.stdout.readline) for _ in range(2)]
        assert lines[0].startswith("admin key: the one given (...-key)"), lines
        assert "$ADMIN_KEY" in lines[1]
        assert not any(ADMIN in line for line in lines), lines
    finally:
        proc.terminate()
        proc.wait(timeout=60)
