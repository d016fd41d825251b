"""Demonstrated turns: a reply the client gives instead of one the model samples.

A scripted policy (an environment's, for a cold start before RL) plays an episode through the
gateway like any agent, but sends each assistant reply it wants recorded in the Chat Completions
field `demonstration` (an assistant message: `content` and/or `tool_calls`). The gateway renders
the prompt as for any request, renders the demonstrated message with the chat template
(`ChatRenderer.reply`: the tokens the model would have to sample to give it, through its
end-of-turn token), answers with those tokens parsed back by the chat format, and records the
turn like a sampled one, with `demonstration: true` and log-probs 0.0 (nothing was sampled).
So demonstrations are traces like any other: one trajectory per episode, tool results as
context, and `tracerl sft` trains on their recorded ids exactly.

A demonstration that the chat format would read back as a different reply (a call it cannot
parse, text it would take for a call) is refused with a 400 naming `demonstration`, and nothing
is recorded: a model trained on it would not be understood.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

from tracerl.engine.types import GenerateOutput, GenerateRequest, PoolError
from tracerl.gateway.api import ApiRequest, Outcome
from tracerl.gateway.messages import BadRequest, openai_messages
from tracerl.gateway.render import ChatRenderer, ReplyNotRendered
from tracerl.gateway.session import SessionState, rendered_messages

FIELD = "demonstration"
"""The Chat Completions body field that holds a demonstrated assistant message."""


def demonstration_of(
    body: dict[str, Any],
    endpoint: str,
    parsed: ApiRequest,
    state: SessionState | None,
    forced: bool,
    renderer: ChatRenderer,
    turn_ends: tuple[str, ...],
) -> tuple[dict[str, Any], list[int]] | None:
    """The request's demonstrated message and its token ids; None when it demonstrates
    nothing. Refused (400, naming the field) where a demonstration cannot be recorded as one."""
    if FIELD not in body:
        return None
    if endpoint != "chat.completions":
        raise BadRequest(FIELD, "is taken on /v1/chat/completions only")
    if state is None:
        raise BadRequest(FIELD, "needs a session: a demonstration is there to be recorded")
    if parsed.stream:
        raise BadRequest(FIELD, "is answered whole: send it with stream false")
    if forced:
        raise BadRequest(FIELD, "cannot be combined with a tool_choice that forces a call")
    message = demonstrated_message(body[FIELD])
    rendered = rendered_messages(renderer, parsed.messages, state)
    return message, demonstrated_ids(renderer, rendered, message, parsed.tools, turn_ends)


def demonstrated_message(value: Any) -> dict[str, Any]:
    """The demonstrated assistant message, validated as an echoed one would be."""
    if not isinstance(value, dict) or value.get("role", "assistant") != "assistant":
        raise BadRequest(FIELD, "expected an assistant message (content and/or tool_calls)")
    try:
        (message,) = openai_messages({"messages": [{**value, "role": "assistant"}]})
    except BadRequest as e:
        raise BadRequest(FIELD, str(e).removeprefix("messages.0").lstrip(".: ")) from None
    return message


def demonstrated_ids(
    renderer: ChatRenderer,
    rendered_messages: list[dict[str, Any]],
    message: dict[str, Any],
    tools: list[dict[str, Any]],
    turn_ends: tuple[str, ...],
) -> list[int]:
    """The token ids of `message` as the chat template writes it after `rendered_messages`
    (the request's messages as the prompt was rendered from them)."""
    try:
        _, text = renderer.reply(rendered_messages, message, tools, turn_ends)
    except ReplyNotRendered as e:
        raise BadRequest(FIELD, str(e)) from None
    return renderer.tokenize(text)


def check_read_back(outcome: Outcome, message: dict[str, Any]) -> None:
    """The chat format must read the demonstrated tokens back as the demonstrated message."""
    given = _meaning(message.get("content"), message.get("tool_calls") or [])
    calls = [
        {"function": {"name": c.name, "arguments": c.arguments_json}}
        for c in outcome.parsed.tool_calls
    ]
    got = _meaning(outcome.parsed.content, calls)
    if got != given:
        raise BadRequest(
            FIELD,
            f"the chat format reads it back as {json.dumps(got)}, not as given "
            f"({json.dumps(given)}): the model could not be understood giving this reply",
        )


def _meaning(content: Any, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A reply's text (stripped) and calls (name, arguments as values)."""
    parsed = []
    for call in calls:
        arguments = call["function"]["arguments"]
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):  # not JSON: compared as text
                arguments = json.loads(arguments)
        parsed.append({"name": call["function"]["name"], "arguments": arguments})
    text = content if isinstance(content, str) else ""
    return {"content": text.strip(), "tool_calls": parsed}


class DemonstrationEngine:
    """Stands in for the engine on a demonstrated turn: its reply is the given ids, with
    log-prob 0.0 each (not sampled) and weight version 0 (no policy's)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def _output(self, request: GenerateRequest) -> GenerateOutput:
        return GenerateOutput(
            rid=request.rid,
            output_ids=list(self.ids),
            output_logprobs=[0.0] * len(self.ids),
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(self.ids),
            weight_version=0,
            finish_reason="stop",
        )

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        return self._output(request)

    async def generate_stream(
        self, request: GenerateRequest
    ) -> AsyncGenerator[GenerateOutput, None]:
        yield self._output(request)


class NoEngine:
    """The engine of a gateway that only records demonstrations (a cold start's): a request to
    sample is answered 503, naming why."""

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        raise PoolError("this gateway records demonstrations only: no engine samples here")

    async def generate_stream(
        self, request: GenerateRequest
    ) -> AsyncGenerator[GenerateOutput, None]:
        raise PoolError("this gateway records demonstrations only: no engine samples here")
        yield  # an async generator
