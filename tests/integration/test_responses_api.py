"""`POST /v1/responses` through the official openai SDK's Responses client, over real sockets:
recorded turns, one trajectory per chain (input items or `previous_response_id`), the exact loss
mask, the stream's event sequence, and the Responses API's own error shape for bad input (with
nothing recorded)."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from tests.fakes import two_turn_loss_mask
from tests.integration.test_gateway_sdk import check_turn_matches_engine, oai

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


async def test_a_response_is_recorded_exactly(make_engine, make_gateway) -> None:
    engine = make_engine()
    gw = await make_gateway(engine)
    session = await gw.open_session()
    client = oai(session)
    reply = await client.responses.create(
        model="tiny", instructions="Be brief.", input="Hello there", max_output_tokens=12,
        temperature=0.8,
    )  # fmt: skip
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    assert turn["endpoint"] == "responses" and turn["response"]["id"] == reply.id
    assert reply.id.startswith("resp_") and reply.object == "response"
    assert reply.usage is not None
    assert reply.usage.input_tokens == len(turn["prompt_ids"])
    assert reply.usage.output_tokens == len(turn["completion_ids"])
    rendered = engine.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert turn["prompt_ids"] == engine.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    sampled = engine.tokenizer.decode(turn["completion_ids"], skip_special_tokens=True).rstrip()
    assert reply.output_text == sampled
    expected = "incomplete" if turn["finish_reason"] == "length" else "completed"
    assert reply.status == expected
    check_turn_matches_engine(engine, turn, 0.8)
    await client.close()


async def test_a_stream_has_the_event_sequence_clients_parse(fake_engine, make_gateway) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    client = oai(session)
    fake.say("It is sunny in Paris.")
    stream = await client.responses.create(model="tiny", input="Weather?", stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added",
    ]  # fmt: skip
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "It is sunny in Paris."
    final = events[-1].response
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    assert final.output_text == text and final.id == turn["response"]["id"]
    sent = final.model_dump(mode="json", exclude_none=True)["output"]
    assert sent == turn["response"]["output"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.model_dump(mode="json", exclude_none=True) for i in done] == sent
    # the SDK's stream helper (which checks the order of events) reads it too
    fake.say("Again.")
    async with client.responses.stream(model="tiny", input="Once more") as helper:
        assert (await helper.get_final_response()).output_text == "Again."
    await client.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_function_call_and_its_output_are_one_trajectory(
    fake_engine, make_gateway, stream: bool
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    client = oai(session)
    fake.say(CALL, "It is sunny in Paris.")
    items: list = [{"role": "user", "content": "Weather in Paris?"}]
    if stream:
        async with client.responses.stream(model="tiny", input=items, tools=[WEATHER]) as s:
            first = await s.get_final_response()
    else:
        first = await client.responses.create(model="tiny", input=items, tools=[WEATHER])
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_")
    items += [item.model_dump(exclude_none=True) for item in first.output]  # as agents replay
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    second = await client.responses.create(model="tiny", input=items, tools=[WEATHER])
    assert second.output_text == "It is sunny in Paris."
    trace = await gw.trace(session["session_id"])
    t0, t1 = trace["turns"]
    assert t0["finish_reason"] == "tool_calls" and t1["parent"] == 0
    (traj,) = trace["trajectories"]
    assert traj["loss_mask"] == two_turn_loss_mask(t0, t1)
    between = t1["prompt_ids"][len(t0["prompt_ids"]) + len(t0["completion_ids"]) :]
    assert "<tool_response>\nsunny\n</tool_response>" in fake.tokenizer.decode(between)
    await client.close()


async def test_a_chain_of_previous_response_ids_is_one_trajectory(
    fake_engine, make_gateway
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    client = oai(session)
    fake.say(CALL, "It is sunny.", "You are welcome.")
    first = await client.responses.create(
        model="tiny", instructions="Be brief.", input="Weather in Paris?", tools=[WEATHER]
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = await client.responses.create(
        model="tiny", instructions="Be brief.", previous_response_id=first.id, input=[output],
        tools=[WEATHER],
    )  # fmt: skip
    third = await client.responses.create(
        model="tiny", instructions="Be brief.", previous_response_id=second.id, input="Thanks!",
        tools=[WEATHER], stream=False,
    )  # fmt: skip
    assert third.previous_response_id == second.id and third.output_text == "You are welcome."
    trace = await gw.trace(session["session_id"])
    t0, t1, t2 = trace["turns"]
    assert (t1["parent"], t2["parent"]) == (0, 1)
    (traj,) = trace["trajectories"]
    ids = t2["prompt_ids"] + t2["completion_ids"]
    assert traj["token_ids"] == ids
    mask = [0] * len(ids)
    for turn in (t0, t1, t2):
        start = len(turn["prompt_ids"])
        mask[start : start + len(turn["completion_ids"])] = [1] * len(turn["completion_ids"])
    assert traj["loss_mask"] == mask
    text = fake.tokenizer.decode(t2["prompt_ids"])
    assert text.count("Weather in Paris?") == 1 and "<tool_response>\nsunny" in text
    await client.close()


async def test_bad_input_gets_the_responses_error_shape_and_records_nothing(
    fake_engine, make_gateway
) -> None:
    _, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    client = oai(session)
    cases = [
        ({"input": [{"type": "input_image_call"}]}, 400, "input.0.type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, 400,
         "input.0.content.0"),
        ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "hi", "text": {"format": {"type": "grammar"}}}, 400, "text.format.type"),
        ({"input": "hi", "text": {"format": {"type": "json_schema", "schema": "x"}}}, 400,
         "text.format.schema"),
        ({}, 400, "input"),
        ({"input": "hi", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ]  # fmt: skip
    for body, status, param in cases:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.responses.create(model="tiny", **body)
        error = caught.value
        assert error.status_code == status, body
        assert isinstance(error.body, dict) and error.body["param"] == param, error.body
        assert error.response.headers["x-should-retry"] == "false"
    assert error.body["code"] == "previous_response_not_found"
    assert error.body["message"] == "Previous response with id 'resp_nope' not found."
    # a response made with store=false cannot be continued; one from another session neither
    stored = await client.responses.create(model="tiny", input="hi")
    unstored = await client.responses.create(model="tiny", input="hi", store=False)
    other = oai(await gw.open_session())
    for reply, who in ((unstored, client), (stored, other)):
        with pytest.raises(openai.NotFoundError):
            await who.responses.create(model="tiny", input="more", previous_response_id=reply.id)
    trace = await gw.trace(session["session_id"])
    assert len(trace["turns"]) == 2  # the two good responses only
    # malformed JSON: still the Responses shape
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{session['openai_base_url']}/responses",
            data=b"{nope",
            headers={"Authorization": f"Bearer {session['api_key']}"},
        ) as resp,
    ):
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "body"
    await client.close()
    await other.close()


async def test_item_references_resolve_to_this_sessions_stored_items(
    fake_engine, make_gateway
) -> None:
    """Clients that keep `store` on (the Vercel AI SDK) send earlier output back as
    `item_reference`s: each is the item it names, and the conversation stays one trajectory;
    an id this session never stored is a 400 naming it, recording nothing."""
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say(f"Let me check.\n{CALL}", "Sunny.")
    client = oai(session)
    first = await client.responses.create(model="tiny", input="Weather?", tools=[WEATHER])
    message, call = first.output
    assert message.type == "message" and call.type == "function_call"
    refs = [{"type": "item_reference", "id": item.id} for item in first.output]
    second = await client.responses.create(
        model="tiny", tools=[WEATHER],
        input=[
            {"role": "user", "content": "Weather?"}, *refs,
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
    )  # fmt: skip
    assert second.output_text == "Sunny."
    trace = await gw.trace(session["session_id"])
    (traj,) = trace["trajectories"]
    assert sum(traj["loss_mask"]) == sum(len(t["completion_ids"]) for t in trace["turns"])
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(
            model="tiny", input=[{"type": "item_reference", "id": "msg_nope"}]
        )
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "input.0.id"
    assert len((await gw.trace(session["session_id"]))["turns"]) == 2
    await client.close()
