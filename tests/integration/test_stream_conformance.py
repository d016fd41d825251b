"""Wire conformance of the gateway's streams, read raw, against hand-written goldens.

For each API (Chat Completions, Responses, Anthropic Messages) and each scenario (a text reply,
a forced tool call, a forced tool call cut by the token budget, a reasoning reply) a gateway over
the scripted fake engine is asked for a stream, which is read as bytes with aiohttp and split
into `event:` / `data:` frames here: no SDK smooths anything over. Then:

- every event is validated against the official SDK's model for it (`tests/sdk_models.py`:
  strict, and no field the model does not declare);
- the events, reduced to what matters (event types, item types and statuses, arguments and text
  as each event carries them, finish / stop reasons, block types), equal the golden file
  `golden/API-SCENARIO.json`. The goldens are the specification, written by hand from the
  gateway's documented behaviour and what the real APIs send (the SDKs' stream accumulators
  show what they rely on); they are edited by hand, never regenerated from the code;
- what the goldens leave out is checked on its own: ids agree within a stream, Responses
  `sequence_number`s are 0..n-1 and `created_at` is an integer, each stream ends as its API's
  do (`[DONE]`; `response.completed` / `response.incomplete`; `message_stop`);
- the stream, accumulated by the SDK's own accumulator and by concatenating its deltas, is the
  non-streamed reply to the same scripted text (itself validated against the SDK's model).

Chat Completions' text case asks for `logprobs` and its tool-call case for usage
(`stream_options`); a fifth Responses case asks for the output text's log-probs (`include`).

How a run of deltas is split into events is not specified (a token per event or all at once),
so consecutive deltas of the same kind to the same target are merged before the comparison;
their order, and what each other event carries, is compared exactly.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests import sdk_models
from tests.integration.conftest import GatewayHandle
from tests.integration.stream_checks import CHECKS, REPLY_OF, VALIDATE_BODY, golden_diff, parse_sse
from tests.integration.test_forced_tools import anthropic_tool, responses_tool
from tests.integration.test_gateway_sdk import WEATHER_TOOL

GOLDEN = Path(__file__).parent / "golden"
QUESTION = "Weather in Tokyo?"
CALL_REST = '{"city": "Tokyo"}}\n</tool_call>'  # what the model says after the forced prefix
REPLIES = {
    "text": "It is sunny.",
    "text_logprobs": "It is sunny.",
    "tool_call": CALL_REST,
    "tool_call_cut": CALL_REST,  # cut after 3 tokens: '{"city":'
    "reasoning": "<think>Paris is in France.</think>It is sunny.",
}
SCENARIOS = ("text", "tool_call", "tool_call_cut", "reasoning")
CASES = [
    *[(api, s) for api in ("chat", "responses", "messages") for s in SCENARIOS],
    # the Responses API's `include` of output logprobs (it crashed streamed)
    ("responses", "text_logprobs"),
]
CUT_BUDGET = 3


def request_body(api: str, scenario: str) -> dict[str, Any]:
    """The streamed request of a case (the non-streamed one is the same without `stream`)."""
    user = {"role": "user", "content": QUESTION}
    forced = scenario.startswith("tool_call")
    budget = CUT_BUDGET if scenario == "tool_call_cut" else None
    if api == "chat":
        body: dict[str, Any] = {"model": "tiny", "messages": [user], "stream": True}
        if forced:
            body["tools"] = [WEATHER_TOOL]
            body["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
        if scenario == "text":
            body["logprobs"] = True
        if scenario == "tool_call":
            body["stream_options"] = {"include_usage": True}
        if budget:
            body["max_tokens"] = budget
    elif api == "responses":
        body = {"model": "tiny", "input": QUESTION, "stream": True}
        if forced:
            body["tools"] = [responses_tool(WEATHER_TOOL)]
            body["tool_choice"] = {"type": "function", "name": "get_weather"}
        if scenario == "text_logprobs":
            body["include"] = ["message.output_text.logprobs"]
        if budget:
            body["max_output_tokens"] = budget
    else:
        body = {"model": "tiny", "max_tokens": budget or 64, "messages": [user], "stream": True}
        if forced:
            body["tools"] = [anthropic_tool(WEATHER_TOOL)]
            body["tool_choice"] = {"type": "tool", "name": "get_weather"}
    return body


# ------------------------------------------------------------------ gateways


@pytest.fixture(scope="session")
def think_tokenizer(tiny: tuple[Any, Any]) -> Any:
    """The tiny tokenizer with a chat template that mentions `<think>`: the gateway then splits
    reasoning off replies (`ChatRenderer.reasoning`). A Jinja comment renders nothing, so the
    prompts are the tiny template's."""
    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.chat_template = tokenizer.chat_template + "{# <think> #}"
    return tokenizer


@pytest.fixture
def think_gateway(think_tokenizer: Any, make_gateway: Any) -> Callable[[Any], Any]:
    """`make_gateway` with the reasoning tokenizer."""

    async def build(engine: Any) -> GatewayHandle:
        return await make_gateway(engine, tokenizer=think_tokenizer)

    return build


def endpoint(api: str, session: dict[str, Any]) -> tuple[str, dict[str, str]]:
    if api == "messages":
        headers = {"x-api-key": session["api_key"], "anthropic-version": "2023-06-01"}
        return f"{session['anthropic_base_url']}/v1/messages", headers
    path = "chat/completions" if api == "chat" else "responses"
    return f"{session['openai_base_url']}/{path}", {"Authorization": f"Bearer {session['api_key']}"}


async def post(url: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[str, str]:
    """(content type, body text) of a 200 reply."""
    try:
        async with aiohttp.ClientSession() as http, http.post(url, headers=headers, json=body) as r:
            status, content_type, text = r.status, r.content_type, await r.text()
    except aiohttp.ClientError as e:  # e.g. a handler that failed after its headers went out
        raise AssertionError(f"the reply broke off: {e!r}") from None
    assert status == 200, f"{status}: {text[:500]}"
    return content_type, text


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize(("api", "scenario"), CASES, ids=[f"{a}-{s}" for a, s in CASES])
async def test_stream_matches_its_golden(
    fake_engine: Any, make_gateway: Any, think_gateway: Any, api: str, scenario: str
) -> None:
    fake, engine_client = fake_engine
    build = think_gateway if scenario == "reasoning" else make_gateway
    gw = await build(engine_client)
    session = await gw.open_session()
    url, headers = endpoint(api, session)
    fake.say(REPLIES[scenario], REPLIES[scenario])  # the streamed request's, the plain one's
    body = request_body(api, scenario)
    content_type, raw = await post(url, headers, body)
    plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    _, plain_text = await post(url, headers, plain)
    problems = []
    if content_type != "text/event-stream":
        problems.append(f"content type {content_type}")
    plain_body = json.loads(plain_text)
    try:
        VALIDATE_BODY[api](plain_body)
    except sdk_models.SdkModelError as e:
        problems.append(f"non-streamed body: {e}")
    if api == "responses" and type(plain_body.get("created_at")) is not int:
        problems.append(f"non-streamed created_at is not an integer: {plain_body['created_at']!r}")
    checked = CHECKS[api](parse_sse(raw), plain_body)
    problems += checked.problems
    golden = json.loads((GOLDEN / f"{api}-{scenario}.json").read_text())
    if checked.entries != golden["events"]:
        problems.append(
            "events differ from the golden:\n" + golden_diff(golden["events"], checked.entries)
        )
    expected = REPLY_OF[api](plain_body)
    if checked.reply != expected:
        problems.append(f"concatenated deltas {checked.reply}\n  != non-streamed {expected}")
    if checked.sdk_reply and checked.sdk_reply != expected:
        problems.append(f"SDK-accumulated stream {checked.sdk_reply}\n  != non-streamed {expected}")
    assert not problems, "\n".join(problems)


def test_the_golden_files_are_the_cases() -> None:
    # a golden without a case (or the reverse) is a spec nobody checks
    names = {p.stem for p in GOLDEN.glob("*.json")}
    assert names == {f"{api}-{scenario}" for api, scenario in CASES}
