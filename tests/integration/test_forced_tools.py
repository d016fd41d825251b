"""Forced tool calls (`tool_choice` "required" or a named function, on all three APIs): the
gateway writes the call's start into the prompt, so the model continues a tool call; that
prefix is context (loss mask 0), what the model sampled after it is the turn's completion, and
the next turn, echoing the call back, extends the same trajectory."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.fakes import two_turn_loss_mask
from tests.integration.test_gateway_sdk import WEATHER_TOOL, claude, oai

TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Local time", "parameters": {"type": "object"}},
}
ARGS = '{"city": "Paris"}}\n</tool_call>'  # what the model samples after a named prefix


def anthropic_tool(tool: dict) -> dict:
    fn = tool["function"]
    return {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}


def responses_tool(tool: dict) -> dict:
    return {"type": "function", **tool["function"]}


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_a_named_tool_is_called_and_its_prefix_is_context(
    fake_engine, make_gateway, api: str
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say(ARGS, "Sunny.")
    question = "Weather in Paris?"
    if api == "chat":
        async with oai(session) as client:
            messages: list = [{"role": "user", "content": question}]
            reply = await client.chat.completions.create(
                model="m", messages=messages, tools=[WEATHER_TOOL, TIME_TOOL],
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
            )  # fmt: skip
            (call,) = reply.choices[0].message.tool_calls or []
            assert call.function.name == "get_weather"  # type: ignore[union-attr]
            assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
            messages += [
                reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
            ]
            await client.chat.completions.create(
                model="m", messages=messages, tools=[WEATHER_TOOL, TIME_TOOL]
            )
    elif api == "messages":
        async with claude(session) as client:
            tools = [anthropic_tool(WEATHER_TOOL), anthropic_tool(TIME_TOOL)]
            msg = await client.messages.create(
                model="m", max_tokens=64, messages=[{"role": "user", "content": question}],
                tools=tools, tool_choice={"type": "tool", "name": "get_weather"},  # type: ignore[arg-type,list-item]
            )  # fmt: skip
            (use,) = [b for b in msg.content if b.type == "tool_use"]
            assert use.name == "get_weather" and use.input == {"city": "Paris"}
            result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}
            await client.messages.create(
                model="m", max_tokens=64, tools=tools,  # type: ignore[arg-type]
                messages=[
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": msg.content},  # type: ignore[typeddict-item]
                    {"role": "user", "content": [result]},  # type: ignore[list-item]
                ],
            )  # fmt: skip
    else:
        async with oai(session) as client:
            tools = [responses_tool(WEATHER_TOOL), responses_tool(TIME_TOOL)]
            first = await client.responses.create(
                model="m", input=question, tools=tools,  # type: ignore[arg-type]
                tool_choice={"type": "function", "name": "get_weather"},
            )  # fmt: skip
            (fc,) = [i for i in first.output if i.type == "function_call"]
            assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"}
            output = {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}
            await client.responses.create(
                model="m",
                input=[output],
                previous_response_id=first.id,
                tools=tools,  # type: ignore[arg-type, list-item]
            )
    trace = await gw.trace(session["session_id"])
    t0, t1 = trace["turns"]
    assert t0["finish_reason"] == "tool_calls" and t1["parent"] == 0
    prompt = fake.tokenizer.decode(t0["prompt_ids"])
    assert prompt.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
    )
    assert fake.tokenizer.decode(t0["completion_ids"], skip_special_tokens=True) == ARGS
    (traj,) = trace["trajectories"]  # the prefix is prompt: loss 0; the continuation: 1
    assert traj["loss_mask"] == two_turn_loss_mask(t0, t1)


async def test_required_lets_the_model_name_the_tool_and_bad_choices_are_400(
    fake_engine, make_gateway
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say('get_time", "arguments": {}}\n</tool_call>', ARGS)
    async with oai(session) as client:
        messages = [{"role": "user", "content": "what time is it?"}]
        two = await client.chat.completions.create(
            model="m", messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required"
        )
        (call,) = two.choices[0].message.tool_calls or []
        assert call.function.name == "get_time"  # type: ignore[union-attr]
        one = await client.chat.completions.create(  # one tool: required names it
            model="m", messages=messages, tools=[WEATHER_TOOL], tool_choice="required"
        )
        assert one.choices[0].finish_reason == "tool_calls"
        cases = [
            ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function",
              "function": {"name": "nope"}}}, "tool_choice.function.name"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ]  # fmt: skip
        for extra, param in cases:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="m", messages=messages, **extra)
            assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param
    async with claude(session) as anth:
        with pytest.raises(anthropic.BadRequestError, match="tool_choice.name"):
            await anth.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}],
                tools=[anthropic_tool(WEATHER_TOOL)], tool_choice={"type": "tool", "name": "x"},  # type: ignore[arg-type,list-item]
            )  # fmt: skip
    prompt = fake.tokenizer.decode(fake.requests[0]["input_ids"])
    assert prompt.endswith('<tool_call>\n{"name": "')  # the model picks the name
    assert len((await gw.trace(session["session_id"]))["turns"]) == 2
