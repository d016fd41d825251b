"""Strict validation of the gateway's wire objects against the official SDKs' own typed models.

Each stream event (a Chat Completions chunk, a Responses API event, an Anthropic Messages event)
and each non-streamed body (`ChatCompletion`, `Response`, `anthropic.types.Message`) is validated
with pydantic in strict mode against the model the SDK itself parses it into, so a wrong type, a
missing required field or an unknown event type fails here rather than in a client.

The SDKs' models accept undeclared fields (`extra="allow"`: the APIs grow fields faster than the
SDKs), which would let a misspelt or invented field through. So after validation every model
instance is walked and any field its model does not declare fails, except the few in
`ALLOWED_EXTRA`: fields the real APIs (or vLLM, whose clients the gateway also serves) send and
document although the SDK models do not declare them. Each entry says where it is documented.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.responses import (
    Response,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseStreamEvent,
)
from pydantic import BaseModel, TypeAdapter, ValidationError

ALLOWED_EXTRA: dict[type[BaseModel], frozenset[str]] = {
    # Reasoning text beside the content, as vLLM's (and DeepSeek's) OpenAI-compatible servers
    # send it, on a streamed delta and on the final message; the SDK has no field for it.
    ChoiceDelta: frozenset({"reasoning_content"}),
    ChatCompletionMessage: frozenset({"reasoning_content"}),
    # OpenAI's OpenAPI document (ResponseFunctionCallArgumentsDoneEvent) lists `name`, the
    # called function's; the SDK's generated model lags it.
    ResponseFunctionCallArgumentsDoneEvent: frozenset({"name"}),
    # The real API echoes the request's `store` in every Response object (its reference
    # examples show it); the SDK declares it only on the request parameters.
    Response: frozenset({"store"}),
}

MAX_ERRORS = 8  # per object: the first few say what is wrong


class SdkModelError(AssertionError):
    """An object the SDK's model rejects, or one carrying fields the model does not declare."""


def _members_by_type(union: Any) -> dict[str, type[BaseModel]]:
    """A discriminated union's members by their `type` literal (for a focused error message)."""
    annotated = get_args(union)  # Annotated[Union[...], discriminator]
    members = get_args(annotated[0]) if annotated else ()
    out: dict[str, type[BaseModel]] = {}
    for member in members:
        for literal in get_args(member.model_fields["type"].annotation):
            out[literal] = member
    return out


# The SDKs mark their unions' discriminator with their own metadata, which pydantic does not
# read: a TypeAdapter tries every member, and the members' `type` literals let exactly one match.
CHAT_CHUNK = TypeAdapter(ChatCompletionChunk)
RESPONSES_EVENT = TypeAdapter(ResponseStreamEvent)
MESSAGES_EVENT = TypeAdapter(RawMessageStreamEvent)
CHAT_COMPLETION = TypeAdapter(ChatCompletion)
RESPONSE = TypeAdapter(Response)
MESSAGE = TypeAdapter(Message)
RESPONSES_MEMBERS = _members_by_type(ResponseStreamEvent)
MESSAGES_MEMBERS = _members_by_type(RawMessageStreamEvent)


def _undeclared(value: Any, path: str) -> Iterator[str]:
    """Every field, anywhere under `value`, that its model neither declares nor allows."""
    if isinstance(value, BaseModel):
        allowed = ALLOWED_EXTRA.get(type(value), frozenset())
        extra = sorted(set(value.model_extra or {}) - allowed)
        if extra:
            yield f"{path or '<root>'}: {type(value).__name__} does not declare {extra}"
        for name in type(value).model_fields:
            # extras are never walked: their values were not validated against anything
            yield from _undeclared(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _undeclared(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _undeclared(item, f"{path}.{key}")


def _validate(adapter: TypeAdapter[Any], data: Any, what: str, members: dict | None = None) -> Any:
    try:
        model = adapter.validate_python(data, strict=True)
    except ValidationError as error:
        raise SdkModelError(f"{what}: {_why(error, data, members)}") from None
    problems = list(_undeclared(model, ""))
    if problems:
        raise SdkModelError(f"{what}: " + "; ".join(problems))
    return model


def _why(error: ValidationError, data: Any, members: dict | None) -> str:
    """What is wrong, said briefly: for an event, the member of the union that its `type` names
    is asked; within nested unions, the members whose own `type` does not match are left out
    (each would list every field it misses), as are pydantic's links."""
    if members is not None:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in members:
            return f"unknown event type {kind!r}"
        try:
            members[kind].model_validate(data, strict=True)
        except ValidationError as focused:
            error = focused
    errors = error.errors(include_url=False)
    wrong = [
        e["loc"][:-1] for e in errors if e["type"] == "literal_error" and e["loc"][-1:] == ("type",)
    ]
    kept = [e for e in errors if not any(e["loc"][: len(w)] == w for w in wrong)] or errors
    lines = [f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e['input']!r:.60})" for e in kept]
    more = f" (and {len(lines) - MAX_ERRORS} more)" if len(lines) > MAX_ERRORS else ""
    return "; ".join(lines[:MAX_ERRORS]) + more


def chat_chunk(data: Any) -> ChatCompletionChunk:
    """One streamed Chat Completions chunk (a `data:` payload other than `[DONE]`)."""
    return _validate(CHAT_CHUNK, data, "chat.completion.chunk")


def responses_event(data: Any) -> Any:
    """One Responses API stream event (a `ResponseStreamEvent` member)."""
    return _validate(RESPONSES_EVENT, data, "responses event", RESPONSES_MEMBERS)


def messages_event(data: Any) -> Any:
    """One Anthropic Messages stream event (a `RawMessageStreamEvent` member)."""
    return _validate(MESSAGES_EVENT, data, "messages event", MESSAGES_MEMBERS)


def chat_completion(data: Any) -> ChatCompletion:
    return _validate(CHAT_COMPLETION, data, "chat.completion")


def response(data: Any) -> Response:
    return _validate(RESPONSE, data, "response")


def message(data: Any) -> Message:
    return _validate(MESSAGE, data, "message")
