"""Fail closed: every untraceable reply or recording failure is a native error, never a success
without a recorded turn. One test per case; each checks what the client saw and what is stored."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

import aiohttp
import pytest

from tests.fakes import LOGPROB, Raw
from tests.waiting import wait_until
from tracerl.engine.client import EngineClient
from tracerl.gateway.store import SQLiteTraceStore, StoreError

CHAT = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


async def post(url: str, session: dict, body: dict, anthropic: bool = False) -> tuple[int, Any]:
    path = "/messages" if anthropic else "/chat/completions"
    base = session["anthropic_base_url"] + "/v1" if anthropic else session["openai_base_url"]
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            base + path, json=body, headers={"Authorization": f"Bearer {session['api_key']}"}
        ) as r,
    ):
        if r.content_type == "text/event-stream":
            return r.status, [line.decode().strip() async for line in r.content if line.strip()]
        return r.status, await r.json()


def good_chunk(fake, ids: list[int], finish: str | None) -> dict:
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "id": "x",
            "finish_reason": {"type": finish} if finish else None,
            "prompt_tokens": 1,
            "completion_tokens": len(ids),
            "output_token_logprobs": [[LOGPROB, i, None] for i in ids],
            "weight_version": 0,
        },
    }


async def recorded(gw, session) -> int:
    return len((await gw.trace(session["session_id"]))["turns"])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (Raw(text="this is not json"), "not a JSON object"),
        (Raw(body=[1, 2, 3]), "not a JSON object"),
        (Raw(body={"text": "x", "output_ids": [5]}), "no meta_info"),
        (
            Raw(body={"output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}}}),
            "no output_token_logprobs",
        ),
        (
            Raw(
                body={
                    "output_ids": [5, 6],
                    "meta_info": {
                        "finish_reason": {"type": "stop"},
                        "output_token_logprobs": [[-0.1, 5, None]],
                    },
                }
            ),
            "disagree",
        ),
        (
            Raw(
                body={
                    "output_ids": [5],
                    "meta_info": {
                        "finish_reason": None,
                        "output_token_logprobs": [[-0.1, 5, None]],
                    },
                }
            ),
            "without a finish reason",
        ),
        (
            Raw(
                body={
                    "output_ids": [],
                    "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": []},
                }
            ),
            "empty completion",
        ),
    ],
    ids=["not-json", "non-object", "no-meta", "no-logprobs", "mismatched", "no-finish", "empty"],
)
async def test_untraceable_replies_are_native_500s(fake_engine, make_gateway, raw, message):
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    session = await gw.open_session()
    fake.reply_raw(raw)
    status, body = await post(gw.url, session, CHAT)
    assert status == 500
    assert message in body["error"]["message"] and body["error"]["type"] == "server_error"
    assert await recorded(gw, session) == 0


async def test_stream_without_end_marker_fails_closed(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    session = await gw.open_session()
    ids = fake.tokenizer("partial answer", add_special_tokens=False)["input_ids"]
    fake.reply_raw(Raw(stream_events=[good_chunk(fake, ids, None)], done=False))
    status, lines = await post(gw.url, session, {**CHAT, "stream": True})
    assert status == 200
    assert "data: [DONE]" not in lines
    error = json.loads(lines[-1][6:])
    assert "stream ended without [DONE]" in error["error"]["message"]
    assert await recorded(gw, session) == 0


async def test_anthropic_stream_without_finish_has_no_message_stop(fake_engine, make_gateway):
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    session = await gw.open_session()
    ids = fake.tokenizer("partial", add_special_tokens=False)["input_ids"]
    fake.reply_raw(Raw(stream_events=[good_chunk(fake, ids, None)], done=True))
    status, lines = await post(gw.url, session, {**CHAT, "stream": True}, anthropic=True)
    assert status == 200
    assert "event: message_stop" not in lines and "event: error" in lines
    error = json.loads(lines[-1][6:])
    assert error["type"] == "error" and "finish reason" in error["error"]["message"]
    assert await recorded(gw, session) == 0


@pytest.mark.parametrize("status", [400, 422, 500, 503])
async def test_engine_errors_pass_through_once(fake_engine, make_gateway, status) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    session = await gw.open_session()
    fake.reply_raw(Raw(status=status, body={"error": {"message": "prompt too long", "code": 1}}))
    got, body = await post(gw.url, session, CHAT)
    assert got == status
    assert body["error"]["message"] == "prompt too long"  # unwrapped, not nested twice
    fake.reply_raw(Raw(status=status, body={"error": {"message": "nope"}}))
    got, body = await post(gw.url, session, CHAT, anthropic=True)
    assert got == status and body == {
        "type": "error",
        "error": {"type": body["error"]["type"], "message": "nope"},
    }
    assert await recorded(gw, session) == 0


async def test_unreachable_engine_is_a_native_503(make_gateway, fake_engine) -> None:
    _, live = fake_engine
    gw = await make_gateway(live)
    gw.gateway.engine = EngineClient("http://127.0.0.1:9", timeout_s=5)  # nothing listens
    session = await gw.open_session()
    status, body = await post(gw.url, session, CHAT)
    assert status == 503 and "unreachable" in body["error"]["message"]
    status, body = await post(gw.url, session, CHAT, anthropic=True)
    assert status == 503 and body["type"] == "error"
    await gw.gateway.engine.close()
    assert await recorded(gw, session) == 0


class FailingStore(SQLiteTraceStore):
    """The real store, except that recording a turn fails."""

    async def append_turn(self, session_id, turn) -> None:
        raise StoreError("disk full")


async def test_recording_failure_is_a_500_and_no_end_marker(
    fake_engine, make_gateway, tmp_path
) -> None:
    _, engine = fake_engine
    gw = await make_gateway(engine, store=FailingStore(tmp_path / "failing.sqlite"))
    session = await gw.open_session()
    status, body = await post(gw.url, session, CHAT)
    assert status == 500 and "could not be recorded: disk full" in body["error"]["message"]
    status, lines = await post(gw.url, session, {**CHAT, "stream": True})
    assert "data: [DONE]" not in lines and "disk full" in lines[-1]
    status, lines = await post(gw.url, session, {**CHAT, "stream": True}, anthropic=True)
    assert "event: message_stop" not in lines and "disk full" in lines[-1]
    assert await recorded(gw, session) == 0
    # Untraced (evaluation) requests do not record, so they still succeed.
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=gw.admin) as r,
    ):
        assert r.status == 200


async def test_client_disconnect_mid_stream_still_records(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    body = {**CHAT, "max_tokens": 300, "stream": True}
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            session["openai_base_url"] + "/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {session['api_key']}"},
        )
        await resp.content.readline()  # the stream has started
        resp.close()  # and the client goes away
    await wait_until(lambda: recorded(gw, session), "the turn recorded", 60)
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    assert turn["client_disconnected"] is True
    assert len(turn["completion_ids"]) == len(turn["completion_logprobs"]) > 0
    status, _ = await post(gw.url, session, {**CHAT, "max_tokens": 4})
    assert status == 200  # the gateway stays healthy


@pytest.mark.parametrize("anthropic", [False, True])
async def test_client_gone_before_the_headers_still_records(
    fake_engine, make_gateway, anthropic: bool
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    session = await gw.open_session()
    fake.hold = asyncio.Event()  # the engine answers only once the client is gone
    base = (
        session["anthropic_base_url"] + "/v1/messages"
        if anthropic
        else (session["openai_base_url"] + "/chat/completions")
    )
    path = "/" + base.split("/", 3)[3]
    payload = json.dumps({**CHAT, "stream": True}).encode()
    host, port = gw.url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {session['api_key']}\r\nx-api-key: {session['api_key']}\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    # the gateway is waiting for the engine's first chunk
    await wait_until(lambda: bool(fake.requests), "the request reached the engine")
    # a reset, not a half-close (after which a server may still answer): the connection is lost
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
    # the gateway has lost the connection (its handler, still running, keeps the entry)
    await wait_until(
        lambda: all(c.transport is None for c in gw.runner.server.connections),
        "the gateway saw the disconnect",
    )
    fake.hold.set()
    await wait_until(lambda: recorded(gw, session), "the turn recorded")
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    assert turn["client_disconnected"] is True
    assert len(turn["completion_ids"]) == len(turn["completion_logprobs"]) > 0
    assert gw.gateway.counters["client_disconnected"] == 1
    status, _ = await post(gw.url, session, {**CHAT, "max_tokens": 4}, anthropic=anthropic)
    assert status == 200  # the gateway stays healthy


async def test_oversized_and_malformed_bodies(fake_engine, make_gateway) -> None:
    _, engine = fake_engine
    gw = await make_gateway(engine, max_request_bytes=4096)
    session = await gw.open_session()
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 10000}]}
    status, body = await post(gw.url, session, big)
    assert status == 413 and "too large" in body["error"]["message"]
    status, body = await post(gw.url, session, {"messages": "nope"})
    assert status == 400 and body["error"]["param"] == "messages"
    status, body = await post(
        gw.url,
        session,
        {
            **CHAT,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
    )
    assert status == 400 and "vision" in body["error"]["message"]
    status, body = await post(gw.url, session, {"messages": CHAT["messages"]}, anthropic=True)
    assert status == 400 and "max_tokens" in body["error"]["message"]
    assert await recorded(gw, session) == 0


async def test_in_process_engine_failure_is_a_native_500(make_engine, make_gateway) -> None:
    from tests.unit.engine.test_step_failure import flaky

    engine = make_engine()
    runner = flaky(engine)
    gw = await make_gateway(engine)
    session = await gw.open_session()
    runner.arm()
    status, body = await post(gw.url, session, CHAT)
    assert status == 500 and "simulated kernel failure" in body["error"]["message"]
    runner.arm(skip=1)  # the first step streams a token, the next one fails
    status, lines = await post(gw.url, session, {**CHAT, "stream": True}, anthropic=True)
    assert status == 200 and "event: message_stop" not in lines
    assert "simulated kernel failure" in lines[-1]
    assert await recorded(gw, session) == 0
    status, _ = await post(gw.url, session, CHAT)
    assert status == 200 and await recorded(gw, session) == 1
