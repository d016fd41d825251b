"""Forced tool calls (`tool_choice` "required" or a named function, on all three APIs): the
gateway writes the call's start into the prompt, so the model continues a tool call; that
prefix is context (loss mask 0), what the model sampled after it, under the JSON schema the
gateway sends the engine, is the turn's completion, and the next turn, echoing the call back,
extends the same trajectory. With the embedded engine and the random `tiny` model, the schema
alone makes the calls valid."""

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
    fake.say('{"name": "get_time", "arguments": {}}', ARGS)  # the value, then the end
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
    assert prompt.endswith("<tool_call>\n")  # the model picks the name, constrained to the tools'
    schema = json.loads(fake.requests[0]["sampling_params"]["json_schema"])
    assert [c["properties"]["name"] for c in schema["anyOf"]] == [
        {"const": "get_weather"},
        {"const": "get_time"},
    ]
    assert schema["anyOf"][0]["properties"]["arguments"] == WEATHER_TOOL["function"]["parameters"]
    # one tool: named, its arguments object under its parameters schema
    named = json.loads(fake.requests[1]["sampling_params"]["json_schema"])
    assert named == WEATHER_TOOL["function"]["parameters"]
    assert fake.tokenizer.decode(fake.requests[1]["input_ids"]).endswith(
        '<tool_call>\n{"name": "get_weather", "arguments": '
    )
    assert len((await gw.trace(session["session_id"]))["turns"]) == 2


CITY_TOOL = {
    "type": "function",
    "function": {
        "name": "book",
        "description": "Book a trip",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome"]},
                "nights": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "nights"],
            "additionalProperties": False,
        },
    },
}
CLOCK_TOOL = {  # no arguments: `{}` is all its schema allows
    "type": "function",
    "function": {
        "name": "clock",
        "description": "The time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


@pytest.mark.parametrize("choice", ["named", "required"])
async def test_the_schema_makes_a_random_models_forced_calls_valid(
    make_engine, make_gateway, choice: str
) -> None:
    # the embedded engine enforces the schema: the random `tiny` model, which left alone
    # writes no JSON at all, calls a tool of the request with arguments its schema allows
    gw = await make_gateway(make_engine())
    session = await gw.open_session()
    tool_choice: object = (
        {"type": "function", "function": {"name": "book"}} if choice == "named" else "required"
    )
    async with oai(session) as client:
        for seed in range(3):
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"trip {seed}"}],
                tools=[CITY_TOOL, CLOCK_TOOL], tool_choice=tool_choice,  # type: ignore[arg-type]
                seed=seed, max_tokens=200,
            )  # fmt: skip
            assert reply.choices[0].finish_reason == "tool_calls", reply
            (call,) = reply.choices[0].message.tool_calls or []
            args = json.loads(call.function.arguments)  # type: ignore[union-attr]
            if call.function.name == "book":  # type: ignore[union-attr]
                assert args["city"] in ("Paris", "Rome") and 1 <= args["nights"] <= 7
                assert set(args) == {"city", "nights"}
            else:
                assert choice == "required" and call.function.name == "clock"  # type: ignore[union-attr]
                assert args == {}
    trace = await gw.trace(session["session_id"])
    for turn in trace["turns"]:  # the arguments (and the name, for any tool) were sampled
        assert turn["completion_ids"] and turn["max_new_tokens"] == 200


async def test_a_schema_the_engine_refuses_is_a_400_naming_the_tools(
    make_engine, make_gateway
) -> None:
    gw = await make_gateway(make_engine())
    session = await gw.open_session()
    broken = {"type": "function", "function": {"name": "odd", "parameters": {"type": "nonsense"}}}
    async with oai(session) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], tools=[broken],  # type: ignore[list-item]
                tool_choice="required",
            )  # fmt: skip
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == "tools"
    assert "forced tool call" in body["message"] and "nonsense" in body["message"]
    assert (await gw.trace(session["session_id"]))["turns"] == []  # nothing recorded
