"""What real clients met in streams and cut replies, each through the official SDK that met it:

- a tool call its `max_tokens` cut (forced, so its start is the gateway's prefix, or sampled
  whole) comes back as a call in progress on every API, streamed or not, showing only what was
  sampled (it used to come back as text that began with the gateway's prefix), and echoed back
  next turn it continues the same trajectory;
- a streamed Responses function call carries its arguments once (they were doubled);
- streamed Chat Completions carry `logprobs` (they had none), all chunks together exactly the
  recorded log-probs;
- a streamed Responses request with `include: ["message.output_text.logprobs"]` completes with
  them (it crashed the handler mid-stream and recorded nothing).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.test_forced_tools import ARGS, anthropic_tool, responses_tool
from tests.integration.test_gateway_sdk import WEATHER_TOOL, claude, oai

NAMED = {"type": "function", "function": {"name": "get_weather"}}
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


def sampled(engine: Any, turn: dict[str, Any]) -> str:
    """What a turn sampled, as text (`engine`: any with the tokenizer, a fake or the real one)."""
    return str(engine.tokenizer.decode(turn["completion_ids"], skip_special_tokens=True))


async def final_response(events: Any) -> Any:
    """The Response a stream ends with, completed or incomplete (the SDK's stream helper
    knows only `response.completed`)."""
    last = None
    async for event in events:
        assert event.type != "response.failed", event
        if event.type in ("response.completed", "response.incomplete"):
            last = event.response
    return last


async def chat_stream_reply(stream: Any) -> dict[str, Any]:
    """A streamed chat reply put together from its chunks (the SDK's stream helper refuses a
    reply cut by its budget): finish reason, content, tool calls' arguments."""
    out: dict[str, Any] = {"finish": None, "text": "", "calls": {}}
    async for chunk in stream:
        for choice in chunk.choices:
            out["text"] += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = out["calls"].setdefault(call.index, {"name": "", "arguments": ""})
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
            out["finish"] = choice.finish_reason or out["finish"]
    return out


async def _cut_call(api: str, stream: bool, session: dict[str, Any]) -> dict[str, Any]:
    """A forced named call cut after 3 tokens, as the SDK gives it back: {arguments, finish,
    text} in the API's own terms."""
    if api == "chat":
        async with oai(session) as client:
            args: dict[str, Any] = dict(
                model="m", messages=QUESTION, tools=[WEATHER_TOOL], tool_choice=NAMED, max_tokens=3
            )
            if stream:
                got = await chat_stream_reply(
                    await client.chat.completions.create(**args, stream=True)
                )
                (call,) = got["calls"].values()
                assert call["name"] == "get_weather"
                return {
                    "arguments": call["arguments"],
                    "finish": got["finish"],
                    "text": got["text"],
                }
            reply = await client.chat.completions.create(**args)
            choice = reply.choices[0]
            (call,) = choice.message.tool_calls or []
            assert call.function.name == "get_weather"  # type: ignore[union-attr]
            return {
                "arguments": call.function.arguments,  # type: ignore[union-attr]
                "finish": choice.finish_reason,
                "text": choice.message.content or "",
            }
    if api == "responses":
        async with oai(session) as client:
            kwargs: dict[str, Any] = dict(
                model="m", input="Weather in Paris?", tools=[responses_tool(WEATHER_TOOL)],
                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=3,
            )  # fmt: skip
            if stream:
                response = await final_response(
                    await client.responses.create(**kwargs, stream=True)
                )
            else:
                response = await client.responses.create(**kwargs)
            (item,) = response.output
            assert item.type == "function_call" and item.status == "incomplete"
            assert response.incomplete_details is not None
            assert response.incomplete_details.reason == "max_output_tokens"
            return {"arguments": item.arguments, "finish": response.status, "text": ""}
    async with claude(session) as anth:
        params: dict[str, Any] = dict(
            model="m", max_tokens=3, messages=QUESTION, tools=[anthropic_tool(WEATHER_TOOL)],
            tool_choice={"type": "tool", "name": "get_weather"},
        )  # fmt: skip
        if stream:
            async with anth.messages.stream(**params) as events:
                message = await events.get_final_message()
        else:
            message = await anth.messages.create(**params)
        (block,) = message.content
        assert block.type == "tool_use" and block.name == "get_weather"
        return {"arguments": block.input, "finish": message.stop_reason, "text": ""}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_a_forced_call_cut_by_max_tokens_is_a_call_in_progress(
    fake_engine, make_gateway, api: str, stream: bool
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say(ARGS)
    got = await _cut_call(api, stream, session)
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    text = sampled(fake, turn)  # what the model sampled after the gateway's prefix
    assert len(turn["completion_ids"]) == 3 and turn["finish_reason"] == "length"
    assert "<tool_call>" not in got["text"] and '"name"' not in json.dumps(got["arguments"])
    if api == "messages":  # its input: the cut arguments read as far as they go
        assert got["finish"] == "max_tokens"
        assert got["arguments"] == turn["response"]["content"][0]["input"]
        assert isinstance(got["arguments"], dict)
    else:
        assert got["arguments"] == text  # exactly what was sampled, nothing else
        assert got["finish"] == ("length" if api == "chat" else "incomplete")


@pytest.mark.parametrize(
    "sampled_arguments",
    ['{"city": "Par', '"Par', '"Paris" "country'],
    ids=["object", "string", "not-an-object"],  # the last was a 400 in a calculator run
)
async def test_a_sampled_call_cut_by_max_tokens_and_echoed_back_continues(
    fake_engine, make_gateway, sampled_arguments: str
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    cut = '<tool_call>\n{"name": "get_weather", "arguments": ' + sampled_arguments
    fake.say(cut, "Sunny.")
    budget = len(fake.tokenizer(cut, add_special_tokens=False)["input_ids"])  # no end token
    async with oai(session) as client:
        reply = await client.chat.completions.create(
            model="m", messages=QUESTION, tools=[WEATHER_TOOL], max_tokens=budget
        )
        choice = reply.choices[0]
        (call,) = choice.message.tool_calls or []
        assert choice.finish_reason == "length" and choice.message.content is None
        arguments = call.function.arguments  # type: ignore[union-attr]
        assert arguments == sampled_arguments  # as sampled, whatever it is
        # the agent echoes the cut call back as it got it, with a result
        messages = [
            *QUESTION,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "error: cut"},
        ]
        await client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL])
    trace = await gw.trace(session["session_id"])
    first = trace["turns"][0]
    assert sampled(fake, first).endswith(arguments)
    (traj,) = trace["trajectories"]  # the echoed cut call re-renders as it was sampled
    assert sum(traj["loss_mask"]) == sum(len(t["completion_ids"]) for t in trace["turns"])


async def test_a_streamed_responses_function_call_has_its_arguments_once(
    fake_engine, make_gateway
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say('{"city": "Tokyo"}}\n</tool_call>')
    async with (
        oai(session) as client,
        client.responses.stream(
            model="m",
            input="Weather in Tokyo?",
            tools=[responses_tool(WEATHER_TOOL)],
            tool_choice="required",
        ) as events,  # fmt: skip
    ):
        kinds = []
        async for event in events:
            kinds.append(event.type)
            if event.type == "response.output_item.added":
                assert event.item.type == "function_call"
                assert event.item.arguments == "" and event.item.status == "in_progress"
        response = await events.get_final_response()
    (item,) = response.output
    assert item.type == "function_call" and item.arguments == '{"city": "Tokyo"}'
    assert kinds.count("response.function_call_arguments.delta") >= 1
    assert kinds.index("response.function_call_arguments.done") < kinds.index(
        "response.output_item.done"
    )
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    assert turn["response"]["output"][0]["arguments"] == '{"city": "Tokyo"}'


async def test_streamed_chat_logprobs_are_the_recorded_ones(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    async with oai(session) as client:
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=16,
            logprobs=True, stream=True, seed=4,
        )  # fmt: skip
        entries = []
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.logprobs is not None and choice.logprobs.content:
                    entries += choice.logprobs.content
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    assert [e.logprob for e in entries] == turn["completion_logprobs"]
    tokens = [engine.tokenizer.decode([i]) for i in turn["completion_ids"]]
    assert [e.token for e in entries] == tokens


async def test_a_streamed_response_with_logprobs_completes_and_is_recorded(
    make_engine, make_gateway
) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    async with oai(session) as client:
        events = await client.responses.create(
            model="tiny", input="Hello", max_output_tokens=12, stream=True,
            include=["message.output_text.logprobs"],
        )  # fmt: skip
        streamed, response = [], None
        async for event in events:
            assert event.type != "response.failed", event
            if event.type == "response.output_text.delta":
                streamed += [lp.logprob for lp in event.logprobs]
            if event.type in ("response.completed", "response.incomplete"):
                response = event.response
    assert response is not None
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    message = next(item for item in response.output if item.type == "message")
    part = message.content[0]
    assert part.type == "output_text" and part.logprobs is not None
    assert [lp.logprob for lp in part.logprobs] == turn["completion_logprobs"]
    # what the deltas carried is a prefix (tokens after the last delta come with .done)
    assert streamed == turn["completion_logprobs"][: len(streamed)] and streamed
