"""What both API surfaces share: the parsed request, the dialect, id minting and SSE framing."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tracerl.gateway.generation import Completion, SamplingSpec
from tracerl.gateway.messages import BadRequest
from tracerl.gateway.parse import ParsedOutput


@dataclass
class ApiRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    spec: SamplingSpec
    stream: bool
    include_usage: bool = False
    want_logprobs: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    max_tokens_param: str = "max_tokens"
    """The caller's name for the token budget, for errors about it."""
    forced_tool: str | None = None
    """A tool call the model must make (`tool_choice` "required" / a named function): the
    tool's name, `ANY_TOOL` for any of them, None when the model may answer freely."""


ANY_TOOL = "*"


def forced_tool(kind: str | None, name: Any, tools: list[dict[str, Any]], param: str) -> str | None:
    """What a `tool_choice` forces, checked against the request's tools: `kind` is
    "required" (any tool) or "function" (the tool `name`, named at `param`)."""
    if kind is None:
        return None
    if not tools:
        raise BadRequest(param, "forces a tool call but the request has no tools")
    names = [t["function"]["name"] for t in tools]
    if kind == "required":
        return names[0] if len(names) == 1 else ANY_TOOL
    if not isinstance(name, str) or name not in names:
        raise BadRequest(param, f"names no tool of the request: {name!r} (tools: {names})")
    return name


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise BadRequest(name, f"expected a number in [{lo}, {hi}], got {value!r}")
    return float(value)


def integer(body: dict[str, Any], name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        raise BadRequest(name, f"expected an integer >= {lo}, got {value!r}")
    return value


def stop_strings(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) and s for s in value):
        return list(value)
    raise BadRequest(name, "expected a string or a list of non-empty strings")


def tool_arguments_json(call: Any) -> str:
    return json.dumps(call.arguments)


@dataclass
class Outcome:
    """A finished generation as both surfaces see it."""

    completion: Completion
    parsed: ParsedOutput
    call_ids: list[str]

    @property
    def has_calls(self) -> bool:
        return bool(self.parsed.tool_calls)

    def returned_message(self) -> dict[str, Any]:
        """The assistant message in the gateway's chat form (what the client will echo back)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.parsed.content}
        if self.parsed.tool_calls:
            message["tool_calls"] = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for cid, c in zip(self.call_ids, self.parsed.tool_calls, strict=True)
            ]
        return message


class ChunkWriter(Protocol):
    """One streamed response's server-sent events, in its API's framing."""

    def start(self, prompt_tokens: int) -> bytes: ...
    def text(self, delta: str) -> bytes: ...
    def finish(self, outcome: Outcome, remaining_text: str) -> bytes: ...
    def end(self) -> bytes: ...
    def error(self, status: int, message: str) -> bytes: ...


@dataclass(frozen=True)
class Dialect:
    """One API surface (OpenAI chat completions and responses, Anthropic messages): everything
    the server
    needs to speak it, so no code outside the surface's module asks which one it is."""

    endpoint: Literal["chat.completions", "messages", "responses"]
    """The trace's name for the turns it records."""
    response_id_prefix: str
    tool_call_id_prefix: str
    parse_request: Callable[[dict[str, Any]], ApiRequest]
    response: Callable[[Outcome, ApiRequest, str, str, Any], dict[str, Any]]
    """(outcome, request, model, response id, tokenizer) -> the response body."""
    chunk_writer: Callable[[str, str, ApiRequest], ChunkWriter]
    """(model, response id, the parsed request) -> a stream's writer."""
    error_body: Callable[[int, str, str | None], dict[str, Any]]
    """(status, message, param) -> the surface's error body."""
    models: Callable[[str], dict[str, Any]]
    """(model name) -> the `GET /v1/models` body."""

    def new_response_id(self) -> str:
        return new_id(self.response_id_prefix)

    def new_tool_call_id(self) -> str:
        return new_id(self.tool_call_id_prefix)
