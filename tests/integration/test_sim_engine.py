"""The simulated engine over the wire protocol: behaviour, determinism, timing model, faults."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.waiting import metric, wait_until
from tracerl.config import SimEngineConfig, SimFaults
from tracerl.engine.client import EngineClient, EngineHTTPError, EngineReplyError
from tracerl.engine.server import (
    SHUTDOWN_TIMEOUT_S,
    STOPPING_KEY,
    build_engine_app,
    start_server,
    stop_engine_server,
)
from tracerl.engine.sim import CRASH_EXIT_CODE, SimEngine, fault_middleware, sim_engine_command
from tracerl.engine.types import GenerateRequest

FAST = {"time_scale": 1000.0, "output_len_median": 20.0, "output_len_sigma": 0.5}


def req(rid: str, prompt: int = 10, **sampling: Any) -> GenerateRequest:
    return GenerateRequest(rid=rid, input_ids=list(range(1, prompt + 1)), sampling_params=sampling)


@pytest.fixture
async def sim() -> AsyncIterator[Any]:
    served: list[tuple[Any, SimEngine, EngineClient]] = []

    async def build(**overrides: Any) -> tuple[SimEngine, EngineClient]:
        faults = overrides.pop("faults", {})
        config = SimEngineConfig(**{**FAST, **overrides}, faults=SimFaults(**faults))
        engine = SimEngine(config)
        app = build_engine_app(engine, middlewares=(fault_middleware(engine),))
        runner, port = await start_server(app, "127.0.0.1", 0)
        client = EngineClient(f"http://127.0.0.1:{port}", timeout_s=10)
        served.append((runner, engine, client))
        return engine, client

    yield build
    for runner, engine, client in served:
        await client.close()
        await runner.cleanup()
        await engine.close()


async def test_generations_are_well_formed_and_deterministic(sim) -> None:
    _, client = await sim(seed=5)
    outs = await asyncio.gather(*(client.generate(req(f"r{i}", seed=i)) for i in range(8)))
    for out in outs:
        assert out.finish_reason in ("stop", "length")
        assert len(out.output_ids) == len(out.output_logprobs) == out.completion_tokens > 0
        assert all(lp <= 0 for lp in out.output_logprobs)
        assert all(0 <= i < 49152 for i in out.output_ids)
        if out.finish_reason == "stop":
            assert out.output_ids[-1] == 2
    _, other = await sim(seed=5)
    again = await asyncio.gather(*(other.generate(req(f"r{i}", seed=i)) for i in range(8)))
    assert [o.output_ids for o in outs] == [o.output_ids for o in again]
    lengths = {len(o.output_ids) for o in outs}
    assert len(lengths) > 1  # lengths are drawn, not fixed
    streamed = [c async for c in other.generate_stream(req("r3", seed=3))]
    assert [t for c in streamed for t in c.output_ids] == outs[3].output_ids


async def test_max_new_tokens_and_abort(sim) -> None:
    _, client = await sim(output_len_median=10_000, output_len_sigma=0.0)
    out = await client.generate(req("short", max_new_tokens=7))
    assert out.finish_reason == "length" and len(out.output_ids) == 7
    chunks: list[Any] = []

    async def consume() -> None:
        async for chunk in client.generate_stream(req("long", max_new_tokens=5000)):
            chunks.append(chunk)

    task = asyncio.create_task(consume())
    await wait_until(lambda: len(chunks) >= 3, "three chunks streamed")
    assert await client.abort("long") == 1
    await task
    assert chunks[-1].finish_reason == "abort"
    assert sum(len(c.output_ids) for c in chunks) == chunks[-1].completion_tokens < 5000


async def test_a_stopping_server_refuses_new_work_and_ends_what_it_holds() -> None:
    """A paused engine told to stop: a request sent once it is stopping gets 503 (a pool then
    resumes it on another engine), and the request it held ends with "abort". Before, the pool
    resumed aborted requests on the same paused engine, which held them, and the shutdown,
    open for aiohttp's 60 s: the server outlived its killed supervisor (CI's Ray run)."""
    engine = SimEngine(SimEngineConfig(**FAST))
    app = build_engine_app(engine)
    runner, port = await start_server(app, "127.0.0.1", 0, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    client = EngineClient(f"http://127.0.0.1:{port}", timeout_s=30)
    try:
        await client.pause()
        held = asyncio.create_task(client.generate(req("held")))

        async def waiting() -> bool:
            return metric(await client.metrics_text(), "vllm:num_requests_waiting") == 1

        await wait_until(waiting, "the request held by the paused engine")
        app[STOPPING_KEY].set()
        with pytest.raises(EngineHTTPError) as refused:
            await client.generate(req("late"))
        assert refused.value.status == 503 and "stopping" in str(refused.value)
        await stop_engine_server(app, runner)
        assert (await held).finish_reason == "abort"
    finally:
        await client.close()


async def test_kv_capacity_queues_and_preempts(sim) -> None:
    _, client = await sim(kv_cache_tokens=200, output_len_median=60, output_len_sigma=0.0)
    outs = await asyncio.gather(*(client.generate(req(f"p{i}", prompt=30)) for i in range(6)))
    assert all(len(o.output_ids) == 60 for o in outs)
    text = await client.metrics_text()
    assert metric(text, "vllm:num_preemptions_total") > 0
    assert metric(text, "vllm:generation_tokens_total") == 360
    assert metric(text, "vllm:prompt_tokens_total") == 180
    assert metric(text, "vllm:num_requests_running") == 0


def test_steps_slow_down_with_the_batch_and_time_scales() -> None:
    """30 steps of (0.01 + 0.01 * n) simulated seconds at 100x: one request ~6 ms a token-step,
    8 requests ~0.9 ms + 0.8 ms each; a bigger batch must take longer per step. Timed on a
    virtual clock (the engine sleeps on its loop's time), so a loaded machine cannot reorder
    the two: wall-clock timings of 40 ms runs did, and failed a fresh `make test`."""
    from tracerl.bench.virtual_time import run_virtual

    async def timed() -> tuple[float, float]:
        engine = SimEngine(
            SimEngineConfig(
                time_scale=100.0,
                decode_step_s=0.01,
                decode_step_s_per_request=0.01,
                output_len_median=30,
                output_len_sigma=0.0,
            )
        )
        await engine.start()
        loop = asyncio.get_running_loop()
        try:
            started = loop.time()
            await engine.generate(req("alone"))
            alone = loop.time() - started
            started = loop.time()
            await asyncio.gather(*(engine.generate(req(f"b{i}")) for i in range(8)))
            return alone, loop.time() - started
        finally:
            await engine.close()

    alone, batched = run_virtual(timed())
    assert alone >= 30 * 0.02 / 100  # never faster than the model says
    assert batched > alone


async def test_error_and_malformed_faults(sim) -> None:
    _, client = await sim(faults={"error_rate": 1.0})
    with pytest.raises(EngineHTTPError) as err:
        await client.generate(req("x"))
    assert err.value.status == 503
    _, client = await sim(faults={"malformed_rate": 1.0}, seed=1)
    for i in range(4):  # both kinds: broken JSON and a reply without logprobs
        with pytest.raises(EngineReplyError):
            await client.generate(req(f"m{i}"))


async def test_oov_fault_samples_past_the_vocabulary(sim) -> None:
    _, client = await sim(faults={"oov_rate": 1.0}, output_len_sigma=0.0)
    out = await client.generate(req("o"))
    assert all(49152 <= i < 49280 for i in out.output_ids[:-1])


async def test_hang_fault_stops_answering(sim) -> None:
    _, client = await sim(faults={"hang_after_requests": 1})
    await client.generate(req("first"))
    quick = EngineClient(client.base_url, timeout_s=0.5)
    with pytest.raises(TimeoutError):
        await quick.generate(req("second"))
    assert not await quick.health()
    await quick.close()


def test_crash_fault_exits_the_process() -> None:
    proc = subprocess.Popen(
        sim_engine_command("--sim.time_scale=1000", "--sim.faults.crash_after_requests=2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert url, line

        async def drive() -> list[Any]:
            client = EngineClient(url.group(0), timeout_s=10)
            try:
                return await asyncio.gather(
                    *(client.generate(req(f"c{i}", max_new_tokens=5)) for i in range(3)),
                    return_exceptions=True,
                )
            finally:
                await client.close()

        results = asyncio.run(drive())
        assert any(isinstance(r, Exception) for r in results)
        assert proc.wait(timeout=30) == CRASH_EXIT_CODE
    finally:
        if proc.poll() is None:
            proc.kill()
