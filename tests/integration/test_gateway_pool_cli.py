"""`tracerl gateway` with several `--engine-url`s: the pool behind the gateway, as processes."""

from __future__ import annotations

import asyncio
import signal

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
