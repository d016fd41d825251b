"""`tracerl gateway` with several `--engine-url`s, or launching its engines, and `tracerl serve` on
a launched backend: the pool behind the gateway, as processes."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys

import aiohttp
import openai

from tests.integration.test_gateway_process import ADMIN, start_gateway
from tracerl.engine.sim import sim_engine_command
from tracerl.rollout.launcher import ProcessLauncher

SIM = ("--sim.time_scale=100", "--sim.output_len_median=8")


async def test_gateway_over_two_simulated_engines(tmp_path) -> None:
    launchers = [ProcessLauncher(sim_engine_command(*SIM, f"--sim.seed={i}")) for i in range(2)]
    urls = await asyncio.gather(*(launcher.start() for launcher in launchers))
    proc = None
    try:
        proc, url = await start_gateway(
            urls[0], str(tmp_path / "t.sqlite"), extra=["--engine-url", urls[1]]
        )
        async with aiohttp.ClientSession() as http:
            sessions = []
            for _ in range(4):
                async with http.post(
                    f"{url}/sessions", headers={"Authorization": f"Bearer {ADMIN}"}
                ) as r:
                    sessions.append(await r.json())
        for s in sessions:
            client = openai.AsyncOpenAI(
                base_url=s["openai_base_url"], api_key=s["api_key"], max_retries=0
            )
            reply = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=16
            )
            assert reply.usage is not None and reply.usage.completion_tokens > 0
            await client.close()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/metrics") as r:
                assert "tracerl_gateway_events_total" in await r.text()
            for s in sessions:
                async with http.get(
                    f"{url}/sessions/{s['session_id']}",
                    headers={"Authorization": f"Bearer {ADMIN}"},
                ) as r:
                    assert len((await r.json())["turns"]) == 1
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        for launcher in launchers:
            await launcher.stop()


async def test_gateway_without_engine_urls_launches_its_backends_engines(tmp_path) -> None:
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracerl.cli.main", "gateway", "--model", "tiny",
         "--store", str(tmp_path / "t.sqlite"), "--port", "0", "--admin-key", ADMIN,
         "--engine.backend=sim", "--engine.count=2", f"--engine.log_dir={logs}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = None
        while url is None:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)
            assert line, "the gateway exited before it was ready"
            if line.startswith("tracerl gateway:"):
                url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)  # type: ignore[union-attr]
        async with aiohttp.ClientSession() as http, http.post(
            f"{url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {ADMIN}"},
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 8},
        ) as r:  # fmt: skip
            assert r.status == 200, await r.text()
        assert sorted(p.name for p in logs.iterdir()) == ["engine-0.log", "engine-1.log"]
        engine_pids = [int(p) for p in _children(proc.pid)]
        assert len(engine_pids) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    for pid in engine_pids:  # the gateway stopped the engines it launched
        assert not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z"


def _children(pid: int) -> list[str]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return f.read().split()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2]


def test_serve_demo_runs_on_a_launched_backend(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tracerl.cli.main", "serve", "--model", "tiny", "--port", "0",
         "--demo", "--engine.backend=sim", f"--engine.log_dir={tmp_path / 'logs'}",
         "--store", str(tmp_path / "t.sqlite")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recorded: session" in done.stdout
    assert (tmp_path / "logs" / "engine-0.log").is_file()
