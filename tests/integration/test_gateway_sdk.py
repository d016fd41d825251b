"""The gateway through the official openai and anthropic SDKs, over real sockets."""

from __future__ import annotations

import json

import aiohttp
import anthropic
import openai
import pytest
import torch

from tests.conftest import reference_logprobs
from tests.fakes import two_turn_loss_mask

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def oai(session: dict) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=session["openai_base_url"], api_key=session["api_key"], max_retries=0
    )


def claude(session: dict) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=session["anthropic_base_url"], api_key=session["api_key"], max_retries=0
    )


def check_turn_matches_engine(engine, turn: dict, temperature: float = 1.0) -> None:
    assert len(turn["completion_ids"]) == len(turn["completion_logprobs"]) > 0
    expected = reference_logprobs(
        engine.model, turn["prompt_ids"], turn["completion_ids"], temperature
    )
    torch.testing.assert_close(torch.tensor(turn["completion_logprobs"]), expected)


async def test_openai_single_turn_is_recorded_exactly(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    client = oai(session)
    reply = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=12,
        temperature=0.8,
        seed=3,
    )
    trace = await gw.trace(session["session_id"])
    (turn,) = trace["turns"]
    assert turn["endpoint"] == "chat.completions"
    assert turn["completion_ids"] and len(turn["completion_ids"]) == reply.usage.completion_tokens
    assert reply.usage.prompt_tokens == len(turn["prompt_ids"])
    rendered = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello there"}], add_generation_prompt=True, tokenize=False
    )
    assert turn["prompt_ids"] == engine.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert (
        reply.choices[0].message.content
        == engine.tokenizer.decode(turn["completion_ids"], skip_special_tokens=True).rstrip()
        or None
    )
    assert turn["response"]["choices"][0]["message"]["content"] == reply.choices[0].message.content
    check_turn_matches_engine(engine, turn, 0.8)
    (traj,) = trace["trajectories"]
    assert traj["token_ids"] == turn["prompt_ids"] + turn["completion_ids"]
    assert traj["loss_mask"] == [0] * len(turn["prompt_ids"]) + [1] * len(turn["completion_ids"])
    await client.close()


async def test_openai_stream_matches_the_record(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    client = oai(session)
    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    assert "".join(pieces) == (turn["response"]["choices"][0]["message"]["content"] or "")
    assert finish == turn["response"]["choices"][0]["finish_reason"]
    assert usage is not None and usage.completion_tokens == len(turn["completion_ids"])
    check_turn_matches_engine(engine, turn)
    await client.close()


async def test_multi_turn_chat_is_one_trajectory(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine, system_prompt="Be brief.")
    session = await gw.open_session()
    client = oai(session)
    messages: list = [{"role": "user", "content": "first question"}]
    for k in range(3):
        reply = await client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=8, seed=k
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"follow-up {k}"},
        ]
    trace = await gw.trace(session["session_id"])
    turns = trace["turns"]
    assert [t["parent"] for t in turns] == [None, 0, 1]
    (traj,) = trace["trajectories"]
    assert traj["turn_indices"] == [0, 1, 2]
    last = turns[-1]
    assert traj["token_ids"] == last["prompt_ids"] + last["completion_ids"]
    sampled = {
        i
        for t in turns
        for i in range(len(t["prompt_ids"]), len(t["prompt_ids"]) + len(t["completion_ids"]))
    }
    assert [i for i, m in enumerate(traj["loss_mask"]) if m] == sorted(sampled)
    prompt_text = engine.tokenizer.decode(turns[0]["prompt_ids"])
    assert prompt_text.startswith("<|im_start|>system\nBe brief.")
    for turn in turns:
        check_turn_matches_engine(engine, turn)
    await client.close()


async def test_replies_alike_as_text_but_sampled_apart_stay_one_trajectory(
    fake_engine, make_gateway
) -> None:
    """Two replies of one session whose returned text is the same but whose samples differ
    (the first with trailing newlines the API strips, as a small model cut at its budget
    writes): each echo is rendered as its own turn sampled it, in order, so the third turn
    still continues the second (an OpenEnv run of SmolLM2 forked here)."""
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    fake.say("Same reply.\n\n", "Same reply.", "Done.")
    session = await gw.open_session()
    client = oai(session)
    messages: list = [{"role": "user", "content": "go"}]
    for k in range(3):
        reply = await client.chat.completions.create(model="tiny", messages=messages)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"again {k}"},
        ]
    assert messages[1]["content"] == messages[3]["content"] == "Same reply."
    trace = await gw.trace(session["session_id"])
    assert [t["parent"] for t in trace["turns"]] == [None, 0, 1]
    (trajectory,) = trace["trajectories"]
    last = trace["turns"][-1]
    assert trajectory["token_ids"] == last["prompt_ids"] + last["completion_ids"]
    await client.close()


async def test_anthropic_plain_and_streaming(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    client = claude(session)
    message = await client.messages.create(
        model="tiny",
        max_tokens=10,
        system="You are terse.",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    )
    assert message.stop_reason in ("end_turn", "max_tokens")
    async with client.messages.stream(
        model="tiny", max_tokens=10, messages=[{"role": "user", "content": "Again"}]
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    turns = (await gw.trace(session["session_id"]))["turns"]
    assert [t["endpoint"] for t in turns] == ["messages", "messages"]
    assert turns[0]["response"]["content"][0]["text"] == message.content[0].text
    assert text == turns[1]["response"]["content"][0]["text"] == final.content[0].text
    assert final.usage.output_tokens == len(turns[1]["completion_ids"])
    for turn in turns:
        check_turn_matches_engine(engine, turn)
    count = await client.messages.count_tokens(
        model="tiny", messages=[{"role": "user", "content": "Hi"}]
    )
    assert count.input_tokens > 0
    assert len((await gw.trace(session["session_id"]))["turns"]) == 2  # count_tokens untraced
    await client.close()


async def test_tool_calls_round_trip_as_one_trajectory(fake_engine, make_gateway) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    client = oai(session)
    fake.say(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "It is sunny in Paris.",
    )
    messages: list = [{"role": "user", "content": "Weather in Paris?"}]
    first = await client.chat.completions.create(
        model="tiny", messages=messages, tools=[WEATHER_TOOL]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24C"},
    ]
    stream = await client.chat.completions.create(
        model="tiny", messages=messages, tools=[WEATHER_TOOL], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "It is sunny in Paris."
    trace = await gw.trace(session["session_id"])
    t0, t1 = trace["turns"]
    assert t0["finish_reason"] == "tool_calls" and t1["parent"] == 0
    (traj,) = trace["trajectories"]
    assert traj["loss_mask"] == two_turn_loss_mask(t0, t1)
    tail = fake.tokenizer.decode(
        t1["prompt_ids"][len(t0["prompt_ids"]) + len(t0["completion_ids"]) :]
    )
    assert "<tool_response>\nsunny, 24C\n</tool_response>" in tail
    system = fake.tokenizer.decode(t0["prompt_ids"])
    assert "<tools>" in system and '"get_weather"' in system
    await client.close()


async def test_anthropic_tool_use_round_trip(fake_engine, make_gateway) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    client = claude(session)
    fake.say(
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        "\n</tool_call>",
        "Cold.",
    )
    tools = [
        {
            "name": "get_weather",
            "description": "weather",
            "input_schema": WEATHER_TOOL["function"]["parameters"],
        }
    ]
    messages: list = [{"role": "user", "content": "Oslo weather?"}]
    async with client.messages.stream(
        model="tiny", max_tokens=64, messages=messages, tools=tools
    ) as stream:
        first = await stream.get_final_message()
    assert first.stop_reason == "tool_use"
    assert first.content[0].text == "Let me check."
    use = first.content[1]
    assert use.type == "tool_use" and use.input == {"city": "Oslo"}
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "-3C"}],
        },
    ]
    second = await client.messages.create(
        model="tiny", max_tokens=64, messages=messages, tools=tools
    )
    assert second.content[0].text == "Cold." and second.stop_reason == "end_turn"
    trace = await gw.trace(session["session_id"])
    assert [t["parent"] for t in trace["turns"]] == [None, 0]
    assert len(trace["trajectories"]) == 1
    await client.close()


async def test_auth_routes_and_auxiliary_endpoints(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    wrong = {**session, "api_key": "nope"}
    with pytest.raises(openai.AuthenticationError):
        await oai(wrong).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.AuthenticationError):
        await claude(wrong).messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )
    other = await gw.open_session()
    with pytest.raises(openai.AuthenticationError):  # a key opens only its own session
        await oai({**session, "api_key": other["api_key"]}).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}]
        )
    models = await oai(session).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    with pytest.raises(openai.NotFoundError):
        await oai(session).completions.create(model="tiny", prompt="legacy")
    with pytest.raises(openai.BadRequestError, match="n=1"):
        await oai(session).chat.completions.create(
            model="tiny", n=2, messages=[{"role": "user", "content": "x"}]
        )
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/messages/bogus", json={}) as r:
            assert r.status == 404 and (await r.json())["type"] == "error"
        plain = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
        key = {"Authorization": f"Bearer {session['api_key']}"}
        async with http.post(
            f"{gw.url}/v1/chat/completions",
            json={**plain, "session_id": session["session_id"]},
            headers=key,
        ) as r:
            assert r.status == 200
        async with http.post(f"{gw.url}/v1/chat/completions", json=plain, headers=gw.admin) as r:
            assert r.status == 200  # evaluation mode: served, not traced
        async with http.post(
            f"{session['openai_base_url']}//chat/completions/?x=1", json=plain, headers=key
        ) as r:
            assert r.status == 200  # normalised path, query string ignored: a generation
        async with http.post(
            f"{gw.url}/sessions/{session['session_id']}/close", headers=gw.admin
        ) as r:
            assert r.status == 200
        assert session["session_id"] not in gw.gateway.sessions  # released, not kept for ever
        async with http.post(
            f"{session['openai_base_url']}/chat/completions", json=plain, headers=key
        ) as r:
            assert r.status == 409  # read back from the store: still closed
        assert session["session_id"] not in gw.gateway.sessions
    trace = await gw.trace(session["session_id"])
    assert trace["status"] == "closed" and len(trace["turns"]) == 2
    assert trace["turns"][0]["request"].get("session_id") is None  # stripped before recording
