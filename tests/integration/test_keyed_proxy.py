"""The key in front of an engine (`tracerl.cluster.keyed_proxy`): a real simulated engine
server behind a real proxy, both on 127.0.0.1, the pool's own client in front."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tracerl.cluster.keyed_proxy import KeyedProxy
from tracerl.config import SimEngineConfig
from tracerl.engine.client import EngineClient, EngineHTTPError
from tracerl.engine.server import build_engine_app, start_server
from tracerl.engine.sim import SimEngine
from tracerl.engine.types import GenerateRequest

KEY = "k-" + "x" * 30


@pytest.fixture
async def proxied() -> AsyncIterator[str]:
    engine = SimEngine(SimEngineConfig(time_scale=1000.0, output_len_median=30.0))
    runner, port = await start_server(build_engine_app(engine), "127.0.0.1", 0)
    proxy = KeyedProxy(f"http://127.0.0.1:{port}", KEY)
    proxy_port = await proxy.start("127.0.0.1")
    yield f"http://127.0.0.1:{proxy_port}"
    await proxy.close()
    await runner.cleanup()
    await engine.close()


def request(rid: str) -> GenerateRequest:
    return GenerateRequest(
        rid=rid, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 40, "seed": 7}
    )


async def test_without_the_key_every_route_is_refused(proxied: str) -> None:
    async with aiohttp.ClientSession() as http:
        for method, path in [("GET", "/health"), ("POST", "/generate"), ("GET", "/metrics")]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                async with http.request(method, proxied + path, headers=headers) as resp:
                    assert resp.status == 401, (method, path, headers)
                    assert "engine.api_key" in (await resp.json())["error"]["message"]
    keyless = EngineClient(proxied, timeout_s=10)
    with pytest.raises(EngineHTTPError) as refused:
        await keyless.model_info()
    assert refused.value.status == 401
    await keyless.close()


async def test_with_the_key_generation_streams_through_unchanged(proxied: str) -> None:
    client = EngineClient(proxied, timeout_s=10, api_key=KEY)
    try:
        assert await client.health()
        whole = await client.generate(request("a"))
        chunks: list[Any] = [c async for c in client.generate_stream(request("a"))]
        assert len(chunks) > 1  # a stream of events, each passed through
        streamed = [t for c in chunks for t in c.output_ids]
        assert streamed == whole.output_ids and len(whole.output_ids) > 0
        assert "vllm:num_requests_running" in await client.metrics_text()
    finally:
        await client.close()


async def test_the_pools_clients_send_engine_api_key(proxied: str) -> None:
    from tracerl.config import EngineConfig
    from tracerl.rollout.backends import client_for

    for backend in ("local", "sglang"):  # every client shares the engine session's headers
        client = client_for(EngineConfig(backend=backend, api_key=KEY), proxied, 10)
        assert isinstance(client, EngineClient)
        assert await client.health()
        await client.close()
