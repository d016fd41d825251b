"""Structured outputs on all three APIs, through the official SDKs' own parse helpers:
Chat Completions' `response_format` (`json_schema`, `json_object`), the Responses API's
`text.format` and Anthropic's `output_config.format`. The schema reaches the engine as
`sampling_params.json_schema`, the embedded engine enforces it (so the random `tiny` model
answers JSON that validates), and the turn is recorded like any other. With tools the model
may call, the format is not enforced (it would rule out the call); a bad format is a 400
naming the caller's field, and a schema the engine cannot compile too."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import openai
import pytest
from pydantic import BaseModel

from tests.integration.test_gateway_sdk import WEATHER_TOOL, claude, oai
from tests.integration.test_gateway_streams import sampled


class Weather(BaseModel):
    """Enums and booleans only: a random model's strings could run past any token budget."""

    city: Literal["Paris", "Tokyo", "Lima"]
    sunny: bool
    wind: Literal["none", "light", "strong"]


async def test_chat_json_schema_is_enforced_on_the_embedded_engine(
    make_engine, make_gateway
) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    async with oai(session) as client:
        for seed in range(3):
            reply = await client.chat.completions.parse(
                model="tiny", messages=[{"role": "user", "content": "Weather?"}],
                response_format=Weather, max_tokens=64, seed=seed,
            )  # fmt: skip
            parsed = reply.choices[0].message.parsed
            assert isinstance(parsed, Weather), reply.choices[0].message.content
            assert reply.choices[0].finish_reason == "stop"
    trace = await gw.trace(session["session_id"])
    assert len(trace["turns"]) == 3
    for turn in trace["turns"]:
        content = turn["response"]["choices"][0]["message"]["content"]
        Weather.model_validate_json(content)  # what the client got is what was recorded
        assert sampled(engine, turn).strip() == content
        assert turn["request"]["response_format"]["type"] == "json_schema"
        assert turn["finish_reason"] == "stop"
    for traj in trace["trajectories"]:
        assert sum(traj["loss_mask"]) == len(
            trace["turns"][traj["turn_indices"][0]]["completion_ids"]
        )


async def test_json_object_and_a_stream_give_a_json_object(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    async with oai(session) as client:
        reply = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "JSON please"}],
            response_format={"type": "json_object"}, max_tokens=48, seed=1,
        )  # fmt: skip
        if reply.choices[0].finish_reason == "stop":  # a random object may outrun its budget
            assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
        else:
            assert (reply.choices[0].message.content or "").lstrip().startswith("{")
        async with client.chat.completions.stream(
            model="tiny", messages=[{"role": "user", "content": "Weather?"}],
            response_format=Weather, max_tokens=64, seed=2,
        ) as stream:  # fmt: skip
            final = await stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Weather)
    turns = (await gw.trace(session["session_id"]))["turns"]
    assert turns[1]["response"]["choices"][0]["message"]["content"] == (
        final.choices[0].message.content
    )


async def test_responses_text_format_is_enforced(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    async with oai(session) as client:
        reply = await client.responses.parse(
            model="tiny", input="Weather?", text_format=Weather, max_output_tokens=64,
        )  # fmt: skip
        assert isinstance(reply.output_parsed, Weather), reply.output_text
        assert reply.text is not None and reply.text.format is not None
        assert reply.text.format.type == "json_schema"  # echoed as asked
        assert isinstance(reply.created_at, float) and reply.created_at == int(reply.created_at)
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    assert turn["response"]["output"][0]["content"][0]["text"] == reply.output_text
    assert isinstance(turn["response"]["created_at"], int)


async def test_anthropic_output_format_is_enforced(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    async with claude(session) as client:
        reply = await client.messages.parse(
            model="tiny", max_tokens=64, output_format=Weather,
            messages=[{"role": "user", "content": "Weather?"}],
        )  # fmt: skip
    assert isinstance(reply.parsed_output, Weather), reply.content
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    assert turn["request"]["output_config"]["format"]["type"] == "json_schema"
    Weather.model_validate_json(turn["response"]["content"][0]["text"])


async def test_the_schema_reaches_the_engine_unless_the_model_may_call_a_tool(
    fake_engine, make_gateway
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    schema = Weather.model_json_schema()
    fake.say('{"city": "Paris", "sunny": true, "wind": "none"}', "{}", "{}", "{}", "free")
    async with oai(session) as client, claude(session) as anth:
        fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], response_format=fmt
        )
        assert json.loads(fake.requests[-1]["sampling_params"]["json_schema"]) == schema
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_object"},
        )  # fmt: skip
        assert json.loads(fake.requests[-1]["sampling_params"]["json_schema"]) == {"type": "object"}
        await client.responses.create(
            model="tiny", input="hi",
            text={"format": {"type": "json_schema", "name": "w", "schema": schema}},
        )  # fmt: skip
        assert json.loads(fake.requests[-1]["sampling_params"]["json_schema"]) == schema
        await anth.messages.create(
            model="tiny", max_tokens=32, messages=[{"role": "user", "content": "hi"}],
            output_config={"format": {"type": "json_schema", "schema": schema}},
        )  # fmt: skip
        assert json.loads(fake.requests[-1]["sampling_params"]["json_schema"]) == schema
        # the model may call a tool: the reply cannot be constrained to the format
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], response_format=fmt,
            tools=[WEATHER_TOOL],
        )  # fmt: skip
        assert fake.requests[-1]["sampling_params"].get("json_schema") is None
    assert gw.gateway.counters["output_format_unenforced"] == 1


@pytest.mark.parametrize(
    ("api", "body", "param"),
    [
        ("chat", {"response_format": {"type": "yaml"}}, "response_format.type"),
        ("chat", {"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            "chat",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 1}}},
            "response_format.json_schema.schema",
        ),
        ("responses", {"text": {"format": {"type": "grammar"}}}, "text.format.type"),
        (
            "messages",
            {"output_config": {"format": {"type": "json_schema", "schema": []}}},
            "output_config.format.schema",
        ),
    ],
)
async def test_a_bad_format_is_a_400_naming_it_and_records_nothing(
    fake_engine, make_gateway, api: str, body: dict, param: str
) -> None:
    _, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    async with oai(session) as client, claude(session) as anth:
        with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as caught:
            if api == "chat":
                await client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}], extra_body=body
                )
            elif api == "responses":
                await client.responses.create(model="tiny", input="hi", extra_body=body)
            else:
                await anth.messages.create(
                    model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                    extra_body=body,
                )  # fmt: skip
    assert param in str(caught.value)
    assert (await gw.trace(session["session_id"]))["turns"] == []


async def test_a_schema_the_engine_cannot_compile_is_a_400_naming_the_format(
    make_engine, make_gateway
) -> None:
    gw = await make_gateway(make_engine())
    session = await gw.open_session()
    bad = {"type": "object", "properties": {"x": {"type": "no-such-type"}}}
    async with oai(session) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}],
                response_format={
                    "type": "json_schema", "json_schema": {"name": "b", "schema": bad}
                },
            )  # fmt: skip
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "response_format", error
    assert "no-such-type" in error["message"] and "sampling_params" not in error["message"]
    assert (await gw.trace(session["session_id"]))["turns"] == []
