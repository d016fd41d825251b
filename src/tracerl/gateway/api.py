"""What both API surfaces share: the parsed request, the dialect, id minting and SSE framing."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tracerl.formats import ParsedOutput
from tracerl.gateway.generation import Completion, SamplingSpec
from tracerl.gateway.messages import BadRequest


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
    output_schema: dict[str, Any] | None = None
    """The JSON schema a structured-output request's reply must match (`response_format`,
    `text.format`, `output_config.format`); None for free text."""
    output_schema_param: str = "response_format"
    """The caller's name for where that schema came from, for errors about it."""


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


def output_schema(fmt: Any, param: str, nested: str | None) -> dict[str, Any] | None:
    """The JSON schema a structured-output format asks for, None for plain text.

    `fmt` is `{"type": "text" | "json_object" | "json_schema", ...}`; a json_schema format
    keeps its schema under `nested` (Chat Completions' `json_schema`) or at its top level
    (`nested` None: the Responses API's and Anthropic's). json_object, and a json_schema
    format without a schema, ask for any JSON object."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest(param, "expected an object with a 'type'")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise BadRequest(
            f"{param}.type", f"expected 'text', 'json_object' or 'json_schema', got {kind!r}"
        )
    where, holder = (param, fmt) if nested is None else (f"{param}.{nested}", fmt.get(nested))
    if not isinstance(holder, dict):
        raise BadRequest(where, "expected an object with the schema")
    schema = holder.get("schema")
    if schema is None:
        return {"type": "object"}
    if not isinstance(schema, dict):
        raise BadRequest(f"{where}.schema", "expected a JSON schema object")
    return schema


def token_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    """Each sampled token with its log-prob, in the OpenAI APIs' shape (with the token's UTF-8
    `bytes`, which the Responses API's text events leave out)."""
    from tracerl.engine.detokenize import safe_decode

    out = []
    for tid, lp in zip(ids, logprobs, strict=True):
        token = safe_decode(tokenizer, [tid])
        out.append(
            {"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": []}
        )
    return out


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


@dataclass
class Outcome:
    """A finished generation as both surfaces see it."""

    completion: Completion
    parsed: ParsedOutput
    call_ids: list[str]

    @property
    def has_calls(self) -> bool:
        return bool(self.parsed.tool_calls)

    @property
    def cut_call(self) -> bool:
        """A tool call the token budget cut short (its arguments incomplete)."""
        return any(c.partial is not None for c in self.parsed.tool_calls)

    @property
    def finish(self) -> Literal["stop", "length", "abort", "tool_calls"]:
        """Why the reply ended, in the trace's terms: "tool_calls" for complete calls; a call
        cut by the budget is "length", as the reply it belongs to."""
        if self.has_calls and not self.cut_call:
            return "tool_calls"
        return self.completion.finish

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
    """One streamed response's server-sent events, in its API's framing. `text` gets the
    reply's sampled ids and log-probs so far (the generation's growing lists) with each text
    delta: the APIs that stream log-probs send those not sent yet beside it."""

    def start(self, prompt_tokens: int) -> bytes: ...
    def text(self, delta: str, ids: list[int], logprobs: list[float]) -> bytes: ...
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
    chunk_writer: Callable[[str, str, ApiRequest, Any], ChunkWriter]
    """(model, response id, the parsed request, tokenizer) -> a stream's writer."""
    error_body: Callable[[int, str, str | None], dict[str, Any]]
    """(status, message, param) -> the surface's error body."""
    models: Callable[[str], dict[str, Any]]
    """(model name) -> the `GET /v1/models` body."""

    def new_response_id(self) -> str:
        return new_id(self.response_id_prefix)

    def new_tool_call_id(self) -> str:
        return new_id(self.tool_call_id_prefix)
