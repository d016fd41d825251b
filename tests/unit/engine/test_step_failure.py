"""A failing model step ends the running requests with an error; the engine keeps serving."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
import torch

from tests.waiting import wait_until
from tracerl.engine.forward import ModelRunner
from tracerl.engine.server import build_engine_app, start_server
from tracerl.engine.types import EngineError, GenerateRequest


class FlakyRunner(ModelRunner):
    """The real runner, except that after `arm(skip)` the forward pass number `skip + 1` raises."""

    countdown: int | None = None

    def arm(self, skip: int = 0) -> None:
        self.countdown = skip

    def forward(self, *args: Any) -> torch.Tensor:
        if self.countdown is not None:
            if self.countdown == 0:
                self.countdown = None
                raise RuntimeError("simulated kernel failure")
            self.countdown -= 1
        return super().forward(*args)


def flaky(engine) -> FlakyRunner:
    runner = FlakyRunner(engine.model, engine.runner.max_slots, engine.max_model_len)
    engine.runner = engine.scheduler.runner = runner
    return runner


async def test_failed_step_fails_running_requests_only(make_engine) -> None:
    engine = make_engine()
    runner = flaky(engine)
    first = asyncio.create_task(
        engine.generate(GenerateRequest(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3}))
    )
    runner.arm()
    with pytest.raises(EngineError, match="simulated kernel failure"):
        await first
    after = await engine.generate(
        GenerateRequest(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3})
    )
    assert len(after.output_ids) == 3
    # stats are published at the end of the step
    await wait_until(lambda: engine.stats().running == 0, "the engine idle")


async def test_failed_step_over_http_is_a_json_500_and_a_stream_without_done(make_engine) -> None:
    engine = make_engine()
    runner = flaky(engine)
    app_runner, port = await start_server(build_engine_app(engine), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}/generate"
    body = {"input_ids": [4, 5], "sampling_params": {"max_new_tokens": 4}}
    try:
        async with aiohttp.ClientSession() as http:
            runner.arm()
            async with http.post(url, json=body) as resp:
                assert resp.status == 500
                assert "simulated kernel failure" in (await resp.json())["error"]["message"]
            runner.arm(skip=1)  # the prefill step succeeds, the next decode step fails
            async with http.post(url, json={**body, "stream": True}) as resp:
                assert resp.status == 200
                lines = [raw.decode().strip() async for raw in resp.content if raw.strip()]
            events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
            assert len(events) == 2
            assert events[0]["output_ids"] and events[0]["meta_info"]["finish_reason"] is None
            assert "simulated kernel failure" in events[1]["error"]["message"]
            assert "data: [DONE]" not in lines
            async with http.post(url, json=body) as resp:
                assert resp.status == 200
    finally:
        await app_runner.cleanup()
