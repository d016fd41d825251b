"""A three-turn tool conversation through the official openai SDK, in each family's chat format:
the family's tokenizer and template render it, the engine (scripted) answers in the family's
markup, the SDK gets the calls and the text, and the trace is one trajectory, including under
thinking templates that drop earlier replies' reasoning once a user message follows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from tests.chat_families import FAMILIES, family_tokenizer
from tests.fakes import FakeEngine, sampled_only
from tests.integration.test_gateway_sdk import WEATHER_TOOL as WEATHER
from tracerl.engine.client import EngineClient
from tracerl.engine.server import start_server
from tracerl.formats import format_for
from tracerl.gateway.render import ChatRenderer

# each family's three replies, as its model writes them: a call (Paris), text, a call (Rome)
ANSWER = "It is 18 C in Paris."
REPLIES: dict[str, list[str]] = {
    "qwen3": [
        '<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call>',
        f"<think>\nI have it.\n</think>\n\n{ANSWER}",
        '<think>\nNow Rome.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Rome"}}\n</tool_call>',
    ],
    "qwen3.5": [  # its generation prompt opens the reasoning
        "The user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        f"I have it.\n</think>\n\n{ANSWER}",
        "Now Rome.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n"
        "</parameter>\n</function>\n</tool_call>",
    ],
    "deepseek-v3.1": [
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ANSWER,
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Rome"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ],
    "glm-4.7": [  # its turn ends at the next speaker's tag
        "The user wants the weather.</think><tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>Paris</arg_value></tool_call><|observation|>",
        f"I have it.</think>{ANSWER}<|user|>",
        "Now Rome.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome"
        "</arg_value></tool_call><|observation|>",
    ],
    "llama3": [
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        ANSWER,
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
    ],
    "mistral": [
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        ANSWER,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
    ],
    "harmony": [
        "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": '
        '"Paris"}<|call|>',
        f"<|channel|>final<|message|>{ANSWER}<|return|>",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": '
        '"Rome"}<|call|>',
    ],
}
REASONING = {"qwen3", "qwen3.5", "glm-4.7", "harmony"}
# templates that render an earlier reply differently than it was sampled by the third turn
# (reasoning dropped after a new user message, or harmony's channels re-written)
REWRITES = {"qwen3", "qwen3.5", "glm-4.7", "harmony"}


@pytest.fixture
async def family_engine() -> AsyncIterator[Any]:
    served: list[tuple[Any, EngineClient]] = []

    async def start(family: str) -> tuple[FakeEngine, EngineClient]:
        tokenizer = family_tokenizer(family)
        stops = frozenset(ChatRenderer(tokenizer).stop_ids())  # the format's end-of-turn tokens
        fake = FakeEngine(tokenizer, eos_id=tokenizer.eos_token_id, stops=stops)
        runner, port = await start_server(fake.app(), "127.0.0.1", 0)
        client = EngineClient(f"http://127.0.0.1:{port}", timeout_s=30)
        served.append((runner, client))
        return fake, client

    yield start
    for runner, client in served:
        await client.close()
        await runner.cleanup()


async def _conversation(gw: Any, session: dict[str, Any]) -> list[Any]:
    client = openai.AsyncOpenAI(
        base_url=session["openai_base_url"], api_key=session["api_key"], max_retries=0
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    replies = []
    for follow_up in ("tool", "user", None):
        reply = await client.chat.completions.create(
            model="m", messages=messages, tools=[WEATHER], max_tokens=200
        )
        message = reply.choices[0].message
        replies.append(reply)
        messages.append(message.model_dump(exclude_none=True))
        if follow_up == "tool":
            (call,) = message.tool_calls or []
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 C"})
        elif follow_up == "user":
            messages.append({"role": "user", "content": "And in Rome?"})
    return replies


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_tool_conversation_is_one_trajectory_in_each_family(
    family: str, family_engine: Any, make_gateway: Any
) -> None:
    fake, engine = await family_engine(family)
    fake.say(*REPLIES[family])
    gw = await make_gateway(engine, tokenizer=fake.tokenizer)
    assert gw.gateway.renderer.format.name == format_for(fake.tokenizer.chat_template).name
    session = await gw.open_session()
    first, second, third = await _conversation(gw, session)

    for reply, city in ((first, "Paris"), (third, "Rome")):
        (call,) = reply.choices[0].message.tool_calls or []
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "get_weather",
            {"city": city},
        )
        assert reply.choices[0].finish_reason == "tool_calls"
        assert not reply.choices[0].message.content
    assert second.choices[0].message.content == ANSWER
    if family in REASONING:  # split off, never content
        assert getattr(first.choices[0].message, "reasoning_content", None)

    trace = await gw.trace(session["session_id"])
    turns = trace["turns"]
    assert [t["parent"] for t in turns] == [None, 0, 1]
    assert [t["fork_reason"] for t in turns] == [None, None, None]
    assert turns[2]["bridged"] == (family in REWRITES)
    trajectory = sampled_only(trace)  # one trajectory: every sampled token, once
    assert trajectory["turn_indices"] == [0, 1, 2]
    # what each turn's prompt holds is what the engine was given
    assert [r["input_ids"] for r in fake.requests] == [t["prompt_ids"] for t in turns]


async def test_rendering_as_the_template_does_forks_and_says_why(
    family_engine: Any, make_gateway: Any
) -> None:
    fake, engine = await family_engine("qwen3")
    fake.say(*REPLIES["qwen3"])
    gw = await make_gateway(engine, tokenizer=fake.tokenizer, history="template")
    session = await gw.open_session()
    await _conversation(gw, session)
    trace = await gw.trace(session["session_id"])
    turns = trace["turns"]
    assert [t["parent"] for t in turns] == [None, 0, None]
    assert not turns[2]["bridged"]
    assert "renders turn 1's reply differently" in turns[2]["fork_reason"]
    assert 'gateway.history = "template"' in turns[2]["fork_reason"]
    assert len(trace["trajectories"]) == 2
    # the third prompt is the template's own: the earlier replies without their reasoning
    rendered = fake.tokenizer.decode(turns[2]["prompt_ids"])
    assert "The user wants the weather." not in rendered and "I have it." not in rendered
