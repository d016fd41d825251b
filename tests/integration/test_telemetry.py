"""Telemetry over real sockets: one episode on the tiny model (embedded engine behind the pool,
the gateway over HTTP, the official openai SDK) exports its spans to an OTLP/HTTP receiver with
the episode as root, its gateway requests as children and the pool's generations below them; a
gRPC receiver gets the same spans; a `command` agent that traces itself with the OpenTelemetry
SDK joins the episode's trace through `TRACEPARENT`, and its `traceparent` header parents the
gateway's request span."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.fakes import Raw
from tests.otlp import GrpcReceiver, HttpReceiver, ReceivedSpan
from tests.waiting import wait_until
from tracerl.config import TelemetryConfig
from tracerl.envs import EnvResult, Session, Task, make_environment
from tracerl.gateway.store import SQLiteTraceStore
from tracerl.rollout.pool import EnginePool, Member
from tracerl.run.rollouts import EpisodeRunner
from tracerl.telemetry import Telemetry, start_telemetry, trace_id_of

AGENTS = Path(__file__).parents[1] / "agents"


class TwoTurns:
    """Two chat requests through the official SDK, the second with a malformed `traceparent`
    header (ignored: its span still hangs below the episode); reward 0.5."""

    name = "two-turns"
    task_fields = ("prompt",)
    reward_fn = None

    async def run(self, task: Task, session: Session) -> EnvResult:
        client = openai.AsyncOpenAI(
            base_url=session.openai_base_url, api_key=session.api_key, max_retries=0
        )
        messages: list[Any] = [{"role": "user", "content": task["prompt"]}]
        async with client:
            await client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
            await client.chat.completions.create(
                model="tiny",
                messages=messages,
                max_tokens=4,
                extra_headers={"traceparent": "00-not-a-trace-01"},
            )
        return EnvResult(0.5)


@pytest.fixture
async def receiver() -> AsyncIterator[HttpReceiver]:
    async with HttpReceiver() as received:
        yield received


async def flush(telemetry: Telemetry) -> None:
    """Export what has ended, off the event loop (the receiver answers on it)."""
    assert await asyncio.to_thread(telemetry.force_flush, 30.0)


async def traced_episode(
    make_gateway: Any, make_engine: Any, telemetry: Telemetry, env: Any, task: Task
) -> tuple[Any, Any]:
    """One episode of `env` through a pool and a gateway exporting to `telemetry`: the rollout
    and the gateway handle."""
    pool = EnginePool([Member("local-0", make_engine())], telemetry=telemetry)
    gw = await make_gateway(pool, telemetry=telemetry)
    runner = EpisodeRunner(
        env, [gw.url], gw.gateway.admin_key, gw.store, timeout_s=120, telemetry=telemetry
    )
    try:
        return await runner.run(task, 3, "train", {}), gw
    finally:
        await runner.close()
        await pool.close()


async def chat(base_url: str, api_key: str) -> None:
    """One chat request through the official SDK."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as sdk:
        await sdk.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}]
        )


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    named = [s for s in spans if s.name == name]
    assert len(named) == 1, [s.name for s in spans]
    return named[0]


async def test_an_episode_exports_its_spans_with_their_structure_over_http(
    make_gateway, make_engine, receiver
) -> None:
    config = TelemetryConfig(otlp_endpoint=receiver.url, service_name="tracerl-test")
    telemetry = start_telemetry(config)
    try:
        rollout, _ = await traced_episode(
            make_gateway, make_engine, telemetry, TwoTurns(), {"prompt": "hi"}
        )
        await flush(telemetry)
    finally:
        await telemetry.close()
    assert rollout.ok
    spans = receiver.spans
    episode = one(spans, "episode")
    requests = receiver.named("gateway.request")
    generations = receiver.named("engine.generate")
    assert len(requests) == len(generations) == 2
    # one trace: the episode is its root, requests its children, generations theirs
    assert {s.trace_id for s in spans} == {episode.trace_id}
    assert episode.parent_id is None and episode.kind == "SPAN_KIND_INTERNAL"
    assert all(r.parent_id == episode.span_id and r.kind == "SPAN_KIND_SERVER" for r in requests)
    assert sorted(g.parent_id or "" for g in generations) == sorted(r.span_id for r in requests)
    assert all(g.kind == "SPAN_KIND_CLIENT" for g in generations)
    assert episode.resource["service.name"] == "tracerl-test"
    assert episode.attributes == {
        "tracerl.env.name": "two-turns",
        "tracerl.episode.group": 3,
        "tracerl.session.id": rollout.session_id,
        "tracerl.episode.kind": "train",
        "tracerl.episode.reward": 0.5,
        "tracerl.episode.duration_s": pytest.approx(rollout.result.duration_s),
        "tracerl.episode.failed": False,
        "tracerl.episode.completion_tokens": rollout.tokens,
        "tracerl.episode.samples": len(rollout.samples),
        "tracerl.weight_version": 0,
    }
    assert episode.status == "UNSET"
    for request in requests:
        a = request.attributes
        assert a["tracerl.session.id"] == rollout.session_id
        assert a["tracerl.gateway.endpoint"] == "chat.completions"
        assert a["tracerl.gateway.parent"] == "session"  # the malformed header was ignored
        assert a["http.response.status_code"] == 200 and a["tracerl.gateway.outcome"] == "ok"
        assert a["gen_ai.usage.input_tokens"] > 0 and 1 <= a["gen_ai.usage.output_tokens"] <= 4
        assert a["tracerl.engine.id"] == "local-0" and a["tracerl.pool.retries"] == 0
        assert request.status == "UNSET"
        assert episode.start_ns <= request.start_ns <= request.end_ns <= episode.end_ns
    assert sum(r.attributes["gen_ai.usage.output_tokens"] for r in requests) == rollout.tokens
    for generation in generations:
        a = generation.attributes
        parent = next(r for r in requests if r.span_id == generation.parent_id)
        assert a["tracerl.engine.id"] == "local-0" and a["tracerl.pool.attempts"] == 1
        assert a["gen_ai.usage.output_tokens"] == parent.attributes["gen_ai.usage.output_tokens"]
        assert a["tracerl.engine.rid"].startswith(rollout.session_id)
        assert a["tracerl.engine.finish_reason"] in ("stop", "length")


async def test_a_failed_request_and_a_failed_episode_are_errors(
    make_gateway, make_engine, receiver
) -> None:
    class Refused:
        """A request the gateway refuses (bad body: 400), then the agent raises."""

        name = "refused"
        task_fields = ()
        reward_fn = None

        async def run(self, task: Task, session: Session) -> EnvResult:
            client = openai.AsyncOpenAI(
                base_url=session.openai_base_url, api_key=session.api_key, max_retries=0
            )
            async with client:
                with pytest.raises(openai.BadRequestError):
                    await client.chat.completions.create(model="tiny", messages=[])
            raise RuntimeError("the agent gave up")

    telemetry = start_telemetry(TelemetryConfig(otlp_endpoint=receiver.url))
    try:
        rollout, _ = await traced_episode(make_gateway, make_engine, telemetry, Refused(), {})
        await flush(telemetry)
    finally:
        await telemetry.close()
    assert rollout.result.failed
    episode, request = one(receiver.spans, "episode"), one(receiver.spans, "gateway.request")
    assert episode.status == "ERROR" and "the agent gave up" in episode.status_message
    assert episode.attributes["tracerl.episode.failed"] is True
    assert "the agent gave up" in episode.attributes["tracerl.episode.failure_reason"]
    assert request.parent_id == episode.span_id
    assert request.attributes["http.response.status_code"] == 400
    assert request.attributes["tracerl.gateway.outcome"] == "rejected"
    assert receiver.named("engine.generate") == []  # refused before any generation


async def test_spans_reach_a_grpc_collector_with_its_headers() -> None:
    collector = GrpcReceiver()
    config = TelemetryConfig(
        otlp_endpoint=collector.url, protocol="grpc", headers={"x-collector-key": "secret"}
    )
    telemetry = start_telemetry(config)
    try:
        with telemetry.span("episode", attributes={"tracerl.env.name": "grpc"}) as episode:
            telemetry.span("gateway.request", parent=episode.traceparent, kind="server").end()
        assert await asyncio.to_thread(telemetry.force_flush, 30.0)
    finally:
        await telemetry.close()
        collector.close()
    by_name = {s.name: s for s in collector.spans}
    assert set(by_name) == {"episode", "gateway.request"}
    assert by_name["gateway.request"].parent_id == by_name["episode"].span_id
    assert by_name["gateway.request"].trace_id == by_name["episode"].trace_id
    assert by_name["episode"].attributes == {"tracerl.env.name": "grpc"}
    assert any(m.get("x-collector-key") == "secret" for m in collector.metadata)


async def test_an_external_agent_joins_the_episode_trace(
    make_gateway, make_engine, receiver
) -> None:
    env = make_environment(
        {
            "name": "command",
            "argv": [sys.executable, str(AGENTS / "traced_agent.py")],
            "env": {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/v1/traces"},
        }
    )
    telemetry = start_telemetry(TelemetryConfig(otlp_endpoint=receiver.url))
    try:
        rollout, _ = await traced_episode(
            make_gateway, make_engine, telemetry, env, {"prompt": "hi"}
        )
        await flush(telemetry)
    finally:
        await telemetry.close()
    assert rollout.ok and rollout.result.metrics == {"had_traceparent": 1.0}
    await wait_until(lambda: bool(receiver.named("agent.run")), "the agent's span")
    episode, agent = one(receiver.spans, "episode"), one(receiver.spans, "agent.run")
    request = one(receiver.spans, "gateway.request")
    assert agent.resource["service.name"] == "traced-agent"
    # the agent's span continues the episode's trace, and parents the request it sent
    assert agent.trace_id == request.trace_id == episode.trace_id
    assert agent.parent_id == episode.span_id
    assert request.parent_id == agent.span_id
    assert request.attributes["tracerl.gateway.parent"] == "header"
    generation = one(receiver.spans, "engine.generate")
    assert generation.parent_id == request.span_id and generation.trace_id == episode.trace_id


async def test_a_session_keeps_its_trace_context_across_a_gateway_restart(
    make_gateway, fake_engine, receiver, tmp_path
) -> None:
    """The context a session was opened with is in the store: a gateway that starts later over
    the same store parents the session's requests on it."""
    fake, client = fake_engine
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    store_path = tmp_path / "traces.sqlite"
    first = await make_gateway(client, SQLiteTraceStore(store_path))
    session = await first.open_session(traceparent=traceparent)
    await first.runner.cleanup()  # that gateway is gone
    telemetry = start_telemetry(TelemetryConfig(otlp_endpoint=receiver.url))
    try:
        second = await make_gateway(client, SQLiteTraceStore(store_path), telemetry=telemetry)
        second.gateway.admin_key = first.gateway.admin_key
        fake.say("hello")
        base_url = session["openai_base_url"].replace(first.url, second.url)
        await chat(base_url, session["api_key"])
        await flush(telemetry)
    finally:
        await telemetry.close()
    request = one(receiver.spans, "gateway.request")
    assert request.trace_id == trace_id_of(traceparent)
    assert request.parent_id == traceparent.split("-")[2]
    assert request.attributes["tracerl.gateway.parent"] == "session"


async def test_a_stream_that_fails_after_its_200_is_an_error_span(
    make_gateway, fake_engine, receiver
) -> None:
    fake, client = fake_engine
    telemetry = start_telemetry(TelemetryConfig(otlp_endpoint=receiver.url))
    try:
        gw = await make_gateway(client, telemetry=telemetry)
        session = await gw.open_session()
        ids = fake.tokenizer("partial", add_special_tokens=False)["input_ids"]
        fake.reply_raw(Raw(stream_events=[good_chunk(ids)], done=False))  # no [DONE]
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        headers = {"Authorization": f"Bearer {session['api_key']}"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{session['openai_base_url']}/chat/completions", json=body, headers=headers
            ) as r,
        ):
            assert r.status == 200
            assert "data: [DONE]" not in await r.text()
        await flush(telemetry)
    finally:
        await telemetry.close()
    request = one(receiver.spans, "gateway.request")
    assert request.status == "ERROR" and "without [DONE]" in request.status_message
    assert request.parent_id is None  # a session opened without a trace context: a root
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["tracerl.gateway.outcome"] == "error"


def good_chunk(ids: list[int]) -> dict[str, Any]:
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "id": "x",
            "finish_reason": None,
            "prompt_tokens": 1,
            "completion_tokens": len(ids),
            "output_token_logprobs": [[-0.5, i, None] for i in ids],
            "weight_version": 0,
        },
    }


async def test_tracerl_serve_exports_its_requests_and_flushes_them_on_exit(
    receiver, tmp_path
) -> None:
    """`tracerl serve --demo` with `--telemetry.otlp_endpoint`: the demo's request span reaches
    the collector before the command exits."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tracerl.cli.main", "serve", "--model", "tiny", "--port", "0",
        "--demo", "--store", str(tmp_path / "traces.sqlite"),
        f"--telemetry.otlp_endpoint={receiver.url}", "--telemetry.service_name=serve-demo",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(300):
        stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    request = one(receiver.spans, "gateway.request")
    assert request.resource["service.name"] == "serve-demo"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["gen_ai.usage.output_tokens"] >= 1
    assert request.attributes["tracerl.session.id"] in stdout.decode()


async def test_a_gateway_actor_exports_with_the_config_it_is_given(
    fake_engine, receiver, tmp_path
) -> None:
    """A Ray gateway actor's class, run in this process: it builds its telemetry from the
    `[telemetry]` config it is handed (a plain, picklable model) and flushes it as it stops."""
    from tracerl.cluster.gateway_actor import GatewayServer, Rendering
    from tracerl.config import EngineConfig, PoolConfig

    fake, client = fake_engine
    server = GatewayServer()
    config = TelemetryConfig(otlp_endpoint=receiver.url, service_name="gateway-actor")
    try:
        url = await server.start(
            EngineConfig(model="tiny"), PoolConfig(), [client.base_url],
            str(tmp_path / "traces.sqlite"), "admin", Rendering(), "127.0.0.1", config,
        )  # fmt: skip
        headers = {"Authorization": "Bearer admin"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/sessions", headers=headers) as r:
                session = await r.json()
            fake.say("hi")
            await chat(session["openai_base_url"], session["api_key"])
    finally:
        await server.stop()  # its telemetry is flushed here
    request, generation = (
        one(receiver.spans, "gateway.request"),
        one(receiver.spans, "engine.generate"),
    )
    assert request.resource["service.name"] == "gateway-actor"
    assert generation.parent_id == request.span_id
    assert generation.attributes["tracerl.engine.id"] == client.base_url


async def test_a_retried_generation_says_so_on_both_spans(
    make_gateway, fake_engine, receiver
) -> None:
    """The engine fails the first attempt (503): the pool retries it, and the request's span and
    its generation's show the engine, the retry and the engine that failed."""
    fake, client = fake_engine
    telemetry = start_telemetry(TelemetryConfig(otlp_endpoint=receiver.url))
    pool = EnginePool([Member("fake-0", client)], telemetry=telemetry)
    try:
        gw = await make_gateway(pool, telemetry=telemetry)
        session = await gw.open_session()
        fake.reply_raw(Raw(status=503, body={"error": {"message": "busy"}}))
        fake.say("hello")
        await chat(session["openai_base_url"], session["api_key"])
        await flush(telemetry)
    finally:
        await telemetry.close()
    request, generation = (
        one(receiver.spans, "gateway.request"),
        one(receiver.spans, "engine.generate"),
    )
    assert request.attributes["tracerl.engine.id"] == "fake-0"
    assert request.attributes["tracerl.pool.retries"] == 1
    assert generation.attributes["tracerl.pool.attempts"] == 2
    assert generation.attributes["tracerl.pool.failed_on"] == "fake-0"
    assert generation.status == "UNSET" and generation.parent_id == request.span_id
