"""What both API surfaces share: the parsed request, id minting and the SSE framing."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

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
