"""The engine wire protocol over a real socket on 127.0.0.1 with a free port."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.waiting import metric, wait_until
from tracerl.engine.client import EngineClient
from tracerl.engine.server import build_engine_app, start_server
from tracerl.engine.types import GenerateRequest


@pytest.fixture
async def served(make_engine) -> AsyncIterator[tuple[str, object]]:
    engine = make_engine(max_model_len=512)
    runner, port = await start_server(
        build_engine_app(engine, max_request_bytes=1 << 16), "127.0.0.1", 0
    )
    yield f"http://127.0.0.1:{port}", engine
    await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_generate_plain_and_streaming(served, http) -> None:
    url, _ = served
    body = {
        "rid": "r1",
        "input_ids": [1, 2, 3, 4],
        "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True},
        "return_logprob": True,
    }
    async with http.post(url + "/generate", json=body) as resp:
        assert resp.status == 200
        plain = await resp.json()
    meta = plain["meta_info"]
    assert meta["id"] == "r1" and meta["finish_reason"]["type"] == "length"
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 6
    assert [p[1] for p in meta["output_token_logprobs"]] == plain["output_ids"]
    assert meta["weight_version"] == 0

    chunks, done = [], False
    async with http.post(url + "/generate", json={**body, "rid": "r2", "stream": True}) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    assert done
    assert [t for c in chunks for t in c["output_ids"]] == plain["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert "".join(c["text"] for c in chunks) == plain["text"]


async def test_client_round_trip(served) -> None:
    url, _ = served
    client = EngineClient(url)
    try:
        request = GenerateRequest(
            input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 5, "seed": 1}
        )
        out = await client.generate(request)
        streamed = [
            c async for c in client.generate_stream(request.model_copy(update={"rid": "s"}))
        ]
        assert [t for c in streamed for t in c.output_ids] == out.output_ids
        assert await client.health() and await client.health_generate()
        info = await client.model_info()
        assert info["max_model_len"] == 512 and info["embedding_size"] > info["vocab_size"]
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"sampling_params": {}}, "input_ids"),
        ({"input_ids": [1, 2, 10**7]}, "input_ids"),
        (
            {"input_ids": [1], "sampling_params": {"max_new_tokens": -1}},
            "sampling_params.max_new_tokens",
        ),
        (
            {"input_ids": [1], "sampling_params": {"max_new_tokens": 10**9}},
            "sampling_params.max_new_tokens",
        ),
        ({"input_ids": list(range(600))}, "input_ids"),
        ([1, 2, 3], "body"),
    ],
)
async def test_bad_requests_get_400_naming_the_field(served, http, body, field) -> None:
    url, _ = served
    for stream in (False, True):
        payload = {**body, "stream": stream} if isinstance(body, dict) else body
        async with http.post(url + "/generate", json=payload) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert error["field"] == field, error
            assert error["message"].startswith(field)
    async with http.post(url + "/generate", data=b"{not json") as resp:
        assert resp.status == 400 and (await resp.json())["error"]["field"] == "body"
    async with http.post(
        url + "/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 2}}
    ) as r:
        assert r.status == 200  # still serving


async def test_oversized_body_gets_413(served, http) -> None:
    url, _ = served
    async with http.post(url + "/generate", json={"input_ids": [1] * 40000}) as resp:
        assert resp.status == 413


async def test_abort_over_http_returns_partial(served, http) -> None:
    url, engine = served
    body = {
        "rid": "long",
        "input_ids": [1, 2],
        "sampling_params": {"max_new_tokens": 500, "ignore_eos": True},
    }
    task = asyncio.create_task(http.post(url + "/generate", json=body))

    async def started() -> bool:
        return engine.stats().generation_tokens_total >= 3

    await wait_until(started)
    async with http.post(url + "/abort_request", json={"rid": "long"}) as resp:
        assert (await resp.json()) == {"aborted": 1}
    resp = await task
    out = await resp.json()
    resp.release()
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(out["output_ids"]) == len(out["meta_info"]["output_token_logprobs"]) < 500
    async with http.post(url + "/abort_request", json={"nothing": 1}) as resp:
        assert resp.status == 400


async def test_disconnecting_client_aborts_its_request(served) -> None:
    url, engine = served
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 480, "ignore_eos": True}}
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(url + "/generate", json=body))

        async def running() -> bool:
            return engine.stats().running == 1

        await wait_until(running)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def freed() -> bool:
        stats = engine.stats()
        return stats.running == 0 and stats.finished_total.get("abort", 0) == 1

    await wait_until(freed)


async def test_pause_continue_and_weight_update_from_disk(served, http, tiny, tmp_path) -> None:
    url, _ = served
    model, _ = tiny
    flipped = type(model)(model.config)
    flipped.load_state_dict(model.state_dict())
    flipped.lm_head.weight.data.mul_(-1)
    flipped.save_pretrained(tmp_path / "v1")
    greedy = {
        "input_ids": [9, 8, 7],
        "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
    }
    async with http.post(url + "/generate", json=greedy) as resp:
        before = await resp.json()

    async with http.post(url + "/pause_generation", json={"mode": "in_place"}) as resp:
        assert resp.status == 200
    async with http.get(url + "/health_generate") as resp:
        assert resp.status == 503
    async with http.get(url + "/metrics") as resp:
        assert metric(await resp.text(), "tracerl:paused") == 1.0
    update = {"model_path": str(tmp_path / "v1"), "weight_version": 1}
    async with http.post(url + "/update_weights_from_disk", json=update) as resp:
        assert (await resp.json())["success"] is True
    async with http.post(url + "/continue_generation") as resp:
        assert resp.status == 200

    async with http.post(url + "/generate", json=greedy) as resp:
        after = await resp.json()
    assert after["meta_info"]["weight_version"] == 1
    assert after["output_ids"] != before["output_ids"]
    bad = {"model_path": str(tmp_path / "missing"), "weight_version": 2}
    async with http.post(url + "/update_weights_from_disk", json=bad) as resp:
        assert resp.status == 400 and (await resp.json())["success"] is False
    async with http.get(url + "/get_model_info") as resp:
        assert (await resp.json())["weight_version"] == 1


async def test_metrics_parse_and_move_with_load(served, http) -> None:
    url, engine = served

    async def scrape() -> str:
        async with http.get(url + "/metrics") as resp:
            assert resp.status == 200
            return await resp.text()

    idle = await scrape()
    assert metric(idle, "vllm:num_requests_running") == 0
    assert metric(idle, "vllm:generation_tokens_total") == 0
    cache = next(
        f for f in text_string_to_metric_families(idle) if f.name == "vllm:cache_config_info"
    ).samples[0]
    assert cache.labels["kv_cache_size_tokens"] == str(engine.config.kv_cache_tokens)

    body = {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 450, "ignore_eos": True}}
    tasks = [
        asyncio.create_task(http.post(url + "/generate", json={**body, "rid": f"m{i}"}))
        for i in range(3)
    ]

    async def busy() -> bool:
        text = await scrape()
        return (
            metric(text, "vllm:num_requests_running") == 3
            and metric(text, "vllm:kv_cache_usage_perc") > 0
        )

    await wait_until(busy)
    for response in await asyncio.gather(*tasks):
        response.release()
    done = await scrape()
    assert metric(done, "vllm:num_requests_running") == 0
    assert metric(done, "vllm:kv_cache_usage_perc") == 0
    assert metric(done, "vllm:generation_tokens_total") == 3 * 450
    assert metric(done, "vllm:prompt_tokens_total") == 3 * 3
    assert metric(done, "vllm:num_preemptions_total") == 0


async def test_disconnecting_stream_aborts_its_request(served) -> None:
    url, engine = served
    body = {
        "input_ids": [1, 2],
        "stream": True,
        "sampling_params": {"max_new_tokens": 480, "ignore_eos": True},
    }
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url + "/generate", json=body)
        line = b""
        while not line.startswith(b"data: "):
            line = await resp.content.readline()
        resp.close()  # drop the connection mid-stream

    async def freed() -> bool:
        stats = engine.stats()
        return stats.running == 0 and stats.finished_total.get("abort", 0) == 1

    await wait_until(freed)
    assert engine.stats().generation_tokens_total < 480
