"""Third-party client libraries through the gateway, against a scripted engine (`make test-compat`
installs them at pinned versions: the Node SDKs under `.npm-compat`, instructor in
`.venv-compat/instructor`). Each client runs as its own process, bounded in time, and prints what
it observed; the tests check that and what the gateway recorded.

- The Vercel AI SDK (`compat_node/ai_sdk.mjs`), on Chat Completions (`openai.chat(model)`) and
  on the provider's default Responses model: `generateText`, `streamText`, an object under a zod
  schema (`generateObject`, and `generateText` with `Output.object`; the schema reaches the
  engine as `sampling_params.json_schema`) and a tool run by the SDK over two steps. On the
  Responses model the SDK's second step refers to the first step's stored items by
  `item_reference` (its `store` defaults to true), or with `store: false` sends them whole.
- The official openai Node SDK (`compat_node/openai_sdk.mjs`): a streamed Responses function
  call whose arguments the SDK assembles once; streamed Chat Completions logprobs; a streamed
  Responses request including the output text's logprobs.
- The official anthropic Node SDK (`compat_node/anthropic_sdk.mjs`): a streamed tool_use block
  whose input the SDK parses once.
- instructor (`compat_clients.py`) extracting a pydantic model in its TOOLS (a forced call),
  JSON (json_object) and JSON_SCHEMA (json_schema) modes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_agents_compat import run_bounded, valid

ROOT = Path(__file__).parents[2]
NPM_PREFIX = ROOT / ".npm-compat"
SCRIPTS = Path(__file__).parent / "compat_node"
INSTRUCTOR = ROOT / ".venv-compat" / "instructor" / "bin" / "python"
NODE = shutil.which("node")
NODE_PACKAGES = ["ai", "@ai-sdk/openai", "openai", "@anthropic-ai/sdk", "zod"]

pytestmark = pytest.mark.compat
needs_node = pytest.mark.skipif(
    NODE is None
    or not all((NPM_PREFIX / "node_modules" / p / "package.json").is_file() for p in NODE_PACKAGES),
    reason="node or the Node client SDKs are not installed (make test-compat installs them)",
)
needs_instructor = pytest.mark.skipif(
    not INSTRUCTOR.is_file(),
    reason="instructor is not installed (make test-compat installs it in .venv-compat/instructor)",
)

ENDPOINT = {"chat": "chat.completions", "responses": "responses"}
PERSON = {"name": "Ada Lovelace", "age": 36}


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    """A complete tool call in the model's own (Hermes) format."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def run_client(argv: list[str], session: dict[str, Any]) -> str:
    """Run one client process against the session; its last stdout line."""
    env = {
        **os.environ,
        "TRACERL_BASE_URL": session["openai_base_url"],
        "TRACERL_ANTHROPIC_BASE_URL": session["anthropic_base_url"],
        "TRACERL_API_KEY": session["api_key"],
        "TRACERL_NPM_PREFIX": str(NPM_PREFIX),
    }
    return await run_bounded(argv, env)


async def node(script: str, *args: str, session: dict[str, Any]) -> dict[str, Any]:
    assert NODE is not None
    line = await run_client([NODE, str(SCRIPTS / f"{script}.mjs"), *args], session)
    return dict(json.loads(line))


def engine_schema(fake: Any) -> Any:
    """The JSON schema the engine was last asked to enforce (a JSON string on the wire)."""
    schema = fake.requests[-1]["sampling_params"].get("json_schema")
    assert schema is not None, "the engine was asked to enforce no schema"
    return json.loads(schema)


# The Vercel AI SDK


@needs_node
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_ai_sdk_generates_text(fake_engine, make_gateway, api: str) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say("Hello there.")
    out = await node("ai_sdk", "text", api, session=session)
    assert out["provider"] == f"openai.{api}"  # openai(model) is the Responses model
    assert out["text"] == "Hello there." and out["finishReason"] == "stop"
    trace = await gw.trace(session["session_id"])
    valid(trace)
    (turn,) = trace["turns"]
    assert turn["endpoint"] == ENDPOINT[api]
    assert out["usage"] == {
        "inputTokens": len(turn["prompt_ids"]),
        "outputTokens": len(turn["completion_ids"]),
    }


@needs_node
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_ai_sdk_streams_text(fake_engine, make_gateway, api: str) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say("Hello there.")
    out = await node("ai_sdk", "stream", api, session=session)
    assert out["errors"] == []
    assert "".join(out["deltas"]) == out["text"] == "Hello there."
    assert out["finishReason"] == "stop"
    trace = await gw.trace(session["session_id"])
    valid(trace)
    (turn,) = trace["turns"]
    assert turn["endpoint"] == ENDPOINT[api] and turn["request"]["stream"] is True
    assert out["usage"]["outputTokens"] == len(turn["completion_ids"])


@needs_node
@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("case", ["object", "output_object"])
async def test_ai_sdk_generates_an_object_under_its_schema(
    fake_engine, make_gateway, api: str, case: str
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say(json.dumps(PERSON))
    out = await node("ai_sdk", case, api, session=session)
    assert out["object"] == PERSON and out["finishReason"] == "stop"
    # the zod schema, as the SDK sent it (Chat: response_format.json_schema; Responses:
    # text.format), is what the engine enforced
    trace = await gw.trace(session["session_id"])
    valid(trace)
    (turn,) = trace["turns"]
    request = turn["request"]
    if api == "chat":
        fmt = request["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "person"
        sent = fmt["json_schema"]["schema"]
    else:
        fmt = request["text"]["format"]
        assert fmt["type"] == "json_schema" and fmt["name"] == "person"
        sent = fmt["schema"]
        assert turn["response"]["text"]["format"]["type"] == "json_schema"  # echoed
    assert set(sent["properties"]) == {"name", "age"}
    assert engine_schema(fake) == sent


@needs_node
@pytest.mark.parametrize(
    ("api", "preamble", "option"),
    [
        ("chat", "", ""),
        ("responses", "", ""),
        ("chat", "Let me check.", ""),
        ("responses", "Let me check.", ""),
        ("responses", "Let me check.", "store=false"),
    ],
)  # fmt: skip
async def test_ai_sdk_runs_a_tool_over_two_steps(
    fake_engine, make_gateway, tiny, api: str, preamble: str, option: str
) -> None:
    """The first step calls the tool, after a line of text (`preamble`) or none; the SDK runs
    it and sends its result back; the second step answers."""
    _, tokenizer = tiny
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    call = hermes_call("get_weather", {"city": "Paris"})
    fake.say(f"{preamble}\n{call}" if preamble else call, "It is sunny in Paris.")
    out = await node("ai_sdk", "tool", api, *[option] if option else [], session=session)
    first, second = out["steps"]
    assert first["finishReason"] == "tool-calls" and first["text"] == preamble
    assert first["toolCalls"] == [{"name": "get_weather", "input": {"city": "Paris"}}]
    assert first["toolResults"] == [{"city": "Paris", "sky": "sunny"}]  # the SDK ran it
    assert second["finishReason"] == "stop" and out["text"] == "It is sunny in Paris."
    trace = await gw.trace(session["session_id"])
    valid(trace)
    assert [t["finish_reason"] for t in trace["turns"]] == ["tool_calls", "stop"]
    assert {t["endpoint"] for t in trace["turns"]} == {ENDPOINT[api]}
    # the tool's result reached the model, in a prompt that extends the first turn's
    assert "sunny" in tokenizer.decode(fake.requests[-1]["input_ids"])
    assert len(trace["trajectories"]) == 1


# The official openai Node SDK


@needs_node
async def test_openai_sdk_streams_a_responses_function_call_once(fake_engine, make_gateway) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say(hermes_call("get_weather", {"city": "Tokyo"}))
    out = await node("openai_sdk", "responses_call", session=session)
    (call,) = out["calls"]
    assert call["name"] == "get_weather" and call["status"] == "completed"
    assert json.loads(call["arguments"]) == {"city": "Tokyo"}, call["arguments"]
    events = out["events"]
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas and "".join(e["delta"] for e in deltas) == call["arguments"]
    # the SDK appends each delta to the item `output_item.added` announced: arguments already
    # there were doubled (`{"city": "Tokyo"}{"city": "Tokyo"}`)
    assert out["snapshots"][-1] == call["arguments"], out["snapshots"]
    kinds = [e["type"] for e in events]
    added = kinds.index("response.output_item.added")
    announced = events[added]["item"]
    assert announced == {"type": "function_call", "status": "in_progress", "arguments": ""}
    done = kinds.index("response.function_call_arguments.done")
    assert events[done]["arguments"] == call["arguments"]
    item_done = kinds.index("response.output_item.done")
    assert events[item_done]["item"]["arguments"] == call["arguments"]
    assert added < kinds.index("response.function_call_arguments.delta") < done < item_done
    assert out["status"] == "completed" and isinstance(out["createdAt"], int)
    trace = await gw.trace(session["session_id"])
    valid(trace)
    assert [t["finish_reason"] for t in trace["turns"]] == ["tool_calls"]


@needs_node
async def test_openai_sdk_streams_chat_logprobs(fake_engine, make_gateway) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say("Hello there.", "Hello there.")
    out = await node("openai_sdk", "chat_logprobs", session=session)
    plain, streamed = out["plain"], out["streamed"]
    assert plain["content"] == "Hello there." and plain["logprobs"]
    chunks = streamed["chunks"]
    assert "".join(c["content"] or "" for c in chunks) == plain["content"]
    assert all(c["logprobs"] for c in chunks if c["content"]), chunks
    assert [e for c in chunks for e in c["logprobs"] or []] == plain["logprobs"]
    assert streamed["finishReason"] == "stop"
    assert out["topLogprobs"]["status"] == 400 and "top_logprobs" in out["topLogprobs"]["message"]
    trace = await gw.trace(session["session_id"])
    valid(trace)
    plain_turn, _ = trace["turns"]  # the refused request recorded nothing
    # one per sampled token, the end-of-turn token's included: what the trace recorded
    assert [e["logprob"] for e in plain["logprobs"]] == plain_turn["completion_logprobs"]


@needs_node
async def test_openai_sdk_streams_responses_output_text_logprobs(fake_engine, make_gateway) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say("Hello there.", "Hello there.")
    out = await node("openai_sdk", "responses_logprobs", session=session)
    plain, streamed = out["plain"], out["streamed"]
    assert plain["text"] == streamed["text"] == "Hello there."
    assert plain["logprobs"] and streamed["logprobs"] == plain["logprobs"]
    assert "".join(d["delta"] for d in out["deltas"]) == streamed["text"]
    # the text deltas' logprobs lead the final part's, which adds the end-of-turn token's
    # (a part's entries carry the token's bytes, a delta's do not, as the API's types say)
    in_deltas = [e for d in out["deltas"] for e in d["logprobs"] or []]
    in_part = [{k: v for k, v in e.items() if k != "bytes"} for e in streamed["logprobs"]]
    assert in_part[: len(in_deltas)] == in_deltas
    assert isinstance(plain["createdAt"], int) and isinstance(streamed["createdAt"], int)
    trace = await gw.trace(session["session_id"])
    valid(trace)
    assert [t["request"].get("stream", False) for t in trace["turns"]] == [False, True]
    recorded = trace["turns"][1]["completion_logprobs"]
    assert [e["logprob"] for e in streamed["logprobs"]] == recorded


# The official anthropic Node SDK


@needs_node
async def test_anthropic_sdk_streams_a_tool_use_parsed_once(fake_engine, make_gateway) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say(hermes_call("get_weather", {"city": "Tokyo"}))
    out = await node("anthropic_sdk", "tool_use", session=session)
    assert out["stopReason"] == "tool_use"
    (use,) = [c for c in out["content"] if c["type"] == "tool_use"]
    assert use["name"] == "get_weather" and use["input"] == {"city": "Tokyo"}
    (start,) = [e["block"] for e in out["events"] if e["type"] == "content_block_start"]
    assert start["type"] == "tool_use" and start["input"] == {}  # the input comes as deltas
    partial = [
        e["delta"]["partial_json"]
        for e in out["events"]
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    ]
    assert json.loads("".join(partial)) == {"city": "Tokyo"}
    trace = await gw.trace(session["session_id"])
    valid(trace)
    (turn,) = trace["turns"]
    assert turn["endpoint"] == "messages" and turn["finish_reason"] == "tool_calls"


# instructor


@needs_instructor
@pytest.mark.parametrize("mode", ["tools", "json", "json_schema"])
async def test_instructor_extracts_a_model(fake_engine, make_gateway, mode: str) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    # TOOLS forces a call of the model's tool: the gateway writes the call up to its
    # arguments, the model samples them and the call's end
    fake.say(json.dumps(PERSON) + ("}\n</tool_call>" if mode == "tools" else ""))
    argv = [str(INSTRUCTOR), str(Path(__file__).parent / "compat_clients.py")]
    line = await run_client([*argv, f"instructor_{mode}"], session)
    assert json.loads(line) == PERSON
    schema = engine_schema(fake)
    trace = await gw.trace(session["session_id"])
    valid(trace)
    (turn,) = trace["turns"]
    request = turn["request"]
    if mode == "tools":
        assert request["tool_choice"]["function"]["name"] == "Person"
        assert set(schema["properties"]) == {"name", "age"}  # the tool's parameters
        assert turn["finish_reason"] == "tool_calls"
    elif mode == "json":
        assert request["response_format"] == {"type": "json_object"}
        assert schema == {"type": "object"}
    else:
        assert request["response_format"]["type"] == "json_schema"
        assert schema == request["response_format"]["json_schema"]["schema"]
        assert set(schema["properties"]) == {"name", "age"}
