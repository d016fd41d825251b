"""What the engine client and the pool owe a long or wide workload: a timeout per reply chunk
(never for the whole stream), no client-side connection limit, tokens in an abort chunk kept,
and a resume that fails after a weight sync taking the engine out of rotation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from tests.waiting import wait_until
from tracerl.config import PoolConfig
from tracerl.engine.client import EngineClient
from tracerl.engine.protocol import collect
from tracerl.engine.server import start_server
from tracerl.engine.types import GenerateRequest
from tracerl.gateway.server import engine_rid
from tracerl.rollout.backends import free_port
from tracerl.rollout.pool import EnginePool, Member, affinity_key


def chunk(ids: list[int], finish: str | None = None, version: int = 0) -> dict[str, Any]:
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "id": "x",
            "finish_reason": {"type": finish} if finish else None,
            "prompt_tokens": 1,
            "completion_tokens": len(ids),
            "output_token_logprobs": [[-0.1, i, None] for i in ids],
            "weight_version": version,
        },
    }


async def info(request: web.Request) -> Any:
    return web.json_response({"weight_version": 1})


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    runners = []

    async def start(handler: Any, **routes: Any) -> str:
        app = web.Application()
        app.router.add_post("/generate", handler)
        app.router.add_get("/get_model_info", info)
        for path, route in routes.items():
            app.router.add_post(f"/{path}", route)
        runner, port = await start_server(app, "127.0.0.1", 0)
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def sse(request: web.Request, events: list[dict[str, Any]], gap_s: float = 0.0) -> Any:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event in events:
        if gap_s:
            await asyncio.sleep(gap_s)  # the fake engine's pace, not a wait of the test's
        await resp.write(f"data: {json.dumps(event)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


def request(rid: str = "s-r", n: int = 40) -> GenerateRequest:
    return GenerateRequest(rid=rid, input_ids=[1], sampling_params={"max_new_tokens": n})


async def test_the_timeout_bounds_each_chunk_not_the_whole_stream(serve) -> None:
    events = [chunk([i]) for i in range(39)] + [chunk([39], "length")]

    async def slow(request: web.Request) -> Any:  # 40 chunks, 50 ms apart: 2 s in all
        return await sse(request, events, gap_s=0.05)

    client = EngineClient(await serve(slow), timeout_s=1.0)
    try:
        ids = [i async for c in client.generate_stream(request()) for i in c.output_ids]
    finally:
        await client.close()
    assert ids == list(range(40))  # a whole-stream timeout of 1 s would have cut it


async def test_there_is_no_client_side_connection_limit(serve) -> None:
    wanted, arrived, all_in = 120, [0], asyncio.Event()  # aiohttp's default limit is 100

    async def held(request: web.Request) -> Any:
        arrived[0] += 1
        if arrived[0] == wanted:
            all_in.set()
        await all_in.wait()  # answered only once every request is open at the same time
        return await sse(request, [chunk([7], "stop")])

    client = EngineClient(await serve(held), timeout_s=60)
    try:
        outs = await asyncio.wait_for(
            asyncio.gather(
                *(collect(client.generate_stream(request(f"s{i}-r"))) for i in range(wanted))
            ),
            60,
        )
    finally:
        await client.close()
    assert len(outs) == wanted and all(o.output_ids == [7] for o in outs)


async def test_tokens_in_an_abort_chunk_reach_the_caller_and_are_resumed(serve) -> None:
    seen: list[list[int]] = []

    async def aborting_then_finishing(request: web.Request) -> Any:
        body = await request.json()
        seen.append(body["input_ids"])
        if len(seen) == 1:  # a weight sync aborts it: the last chunk carries two tokens
            return await sse(request, [chunk([10]), chunk([11, 12], "abort")])
        return await sse(request, [chunk([13], "length", version=1)])

    pool = EnginePool([Member("e", EngineClient(await serve(aborting_then_finishing)))])
    chunks = [c async for c in pool.generate_stream(request(n=4))]
    assert [i for c in chunks for i in c.output_ids] == [10, 11, 12, 13]
    assert [c.finish_reason for c in chunks] == [None, None, "length"]
    assert seen[1] == [1, 10, 11, 12]  # resumed after every token the engine sampled
    assert chunks[-1].weight_version_min == 0 and chunks[-1].weight_version == 1
    assert pool.counters["aborted_resumed"] == 1
    await pool.close()


async def test_a_constrained_request_resumed_mid_value_continues_unconstrained(serve) -> None:
    # no engine API starts a JSON schema's grammar part-way through its value: sent again with
    # the partial output as prompt, the schema would constrain the rest as a new value
    seen: list[dict[str, Any]] = []

    async def aborting_then_finishing(request: web.Request) -> Any:
        seen.append(await request.json())
        if len(seen) == 1:
            return await sse(request, [chunk([10, 11], "abort")])
        return await sse(request, [chunk([12], "stop")])

    pool = EnginePool([Member("e", EngineClient(await serve(aborting_then_finishing)))])
    schema = '{"type": "object"}'
    constrained = GenerateRequest(
        rid="s-r", input_ids=[1], sampling_params={"max_new_tokens": 9, "json_schema": schema}
    )
    out = await pool.generate(constrained)
    assert out.output_ids == [10, 11, 12]
    assert seen[0]["sampling_params"]["json_schema"] == schema
    assert seen[1]["input_ids"] == [1, 10, 11] and seen[1]["sampling_params"]["json_schema"] is None
    assert pool.counters["resumed_unconstrained"] == 1
    await pool.close()


async def test_a_resume_that_fails_after_a_weight_sync_takes_the_engine_out(serve) -> None:
    async def generate(request: web.Request) -> Any:
        return await sse(request, [chunk([1], "stop")])

    async def ok(request: web.Request) -> Any:
        return web.json_response({})

    async def broken(request: web.Request) -> Any:
        return web.json_response({"error": "cannot resume"}, status=500)

    members = []
    for i, resume in enumerate((ok, broken)):
        url = await serve(
            generate, pause_generation=ok, continue_generation=resume, update_weights_from_disk=ok
        )
        members.append(Member(f"e{i}", EngineClient(url)))
    pool = EnginePool(members, PoolConfig(failure_threshold=2))
    await pool.update_weights("/weights", 1)
    assert [m.active for m in pool.members] == [True, False]  # paused for good: out
    assert pool.counters["resume_failed"] == 1
    await pool.close()


async def test_an_engine_gone_while_paused_is_taken_out_not_raised(serve) -> None:
    # the Ray engine-kill run: an engine died while the trainer held the engines paused, and
    # the pool's resume raised its connection error into the loop, which ended the run
    async def generate(request: web.Request) -> Any:
        return await sse(request, [chunk([1], "stop")])

    async def ok(request: web.Request) -> Any:
        return web.json_response({})

    clients = [
        EngineClient(await serve(generate, pause_generation=ok, continue_generation=ok))
        for _ in range(2)
    ]
    gone = EngineClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    pool = EnginePool([Member(f"e{i}", c) for i, c in enumerate(clients)], PoolConfig())
    await pool.pause("in_place")
    pool.members[1].engine = gone  # dies while paused
    await pool.resume()
    assert [m.active for m in pool.members] == [True, False]
    assert pool.counters["resume_failed"] == 1
    pool.members[0].engine = gone  # dies between steps: the next pause finds it gone
    await pool.pause("in_place")
    assert not pool.members[0].active and pool.counters["pause_failed"] == 1
    await pool.resume()  # nothing active is left to resume: no error either
    for client in clients:
        await client.close()
    await pool.close()


async def test_untraced_requests_do_not_share_one_engine(serve) -> None:
    rids = [engine_rid(None, f"chatcmpl-{i:04d}") for i in range(8)]
    assert len({affinity_key(r) for r in rids}) == 8
    assert affinity_key(engine_rid("sess", "chatcmpl-1")) == "sess"

    hold = asyncio.Event()

    async def held(request: web.Request) -> Any:
        await hold.wait()
        return await sse(request, [chunk([1], "stop")])

    members = [Member(f"e{i}", EngineClient(await serve(held))) for i in range(2)]
    pool = EnginePool(members)
    tasks = [asyncio.create_task(pool.generate(request(r))) for r in rids[:4]]
    await wait_until(lambda: sum(m.inflight for m in pool.members) == 4, "4 in flight")
    assert [m.inflight for m in pool.members] == [2, 2]  # spread, not all on one key's engine
    hold.set()
    await asyncio.gather(*tasks)
    await pool.close()
