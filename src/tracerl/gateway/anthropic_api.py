"""The Anthropic Messages surface: request parsing, responses and stream events.

Structured outputs (`output_config.format`, or the older top-level `output_format`, each
`{"type": "json_schema", "schema"}`) become the JSON schema the engine enforces. A tool call
the token budget cut is a `tool_use` block whose `input` is its arguments read as far as they
go (streamed: the cut JSON text itself), with `stop_reason: "max_tokens"`.
"""

from __future__ import annotations

import json
from typing import Any

from tracerl.gateway.api import (
    ApiRequest,
    Dialect,
    Outcome,
    forced_tool,
    integer,
    number,
    output_schema,
    sse,
    stop_strings,
)
from tracerl.gateway.generation import SamplingSpec
from tracerl.gateway.messages import BadRequest, anthropic_messages, anthropic_tools


def parse_request(body: dict[str, Any]) -> ApiRequest:
    max_tokens = integer(body, "max_tokens", 1)
    if max_tokens is None:
        raise BadRequest("max_tokens", "is required")
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else choice
    tools = [] if kind == "none" else anthropic_tools(body)
    if kind in (None, "auto", "none"):
        forced = None
    elif kind == "any":
        forced = forced_tool("required", None, tools, "tool_choice")
    elif kind == "tool" and isinstance(choice, dict):
        forced = forced_tool("function", choice.get("name"), tools, "tool_choice.name")
    else:
        raise BadRequest("tool_choice", "expected type 'auto', 'any', 'tool' or 'none'")
    top_k = integer(body, "top_k", 1)
    config = body.get("output_config") or {}
    if not isinstance(config, dict):
        raise BadRequest("output_config", "expected an object")
    where = "output_config.format" if config.get("format") is not None else "output_format"
    fmt = config.get("format") or body.get("output_format")
    return ApiRequest(
        messages=anthropic_messages(body),
        tools=tools,
        forced_tool=forced,
        spec=SamplingSpec(
            max_new_tokens=max_tokens,
            temperature=number(body, "temperature", 1.0, 0.0, 1.0),
            top_p=number(body, "top_p", 1.0, 1e-9, 1.0),
            top_k=top_k if top_k is not None else -1,
            stop=stop_strings(body.get("stop_sequences"), "stop_sequences"),
        ),
        stream=bool(body.get("stream", False)),
        output_schema=output_schema(fmt, where, None),
        output_schema_param=where,
    )


def stop_reason(outcome: Outcome) -> str:
    if outcome.finish == "tool_calls":
        return "tool_use"
    c = outcome.completion
    if c.stop_sequence is not None:
        return "stop_sequence"
    # An engine abort is an interrupted turn the caller may continue.
    return {"stop": "end_turn", "length": "max_tokens", "abort": "pause_turn"}[c.finish]


def content_blocks(outcome: Outcome) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if outcome.parsed.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": outcome.parsed.reasoning, "signature": ""})
    if outcome.parsed.content or not outcome.has_calls:
        blocks.append({"type": "text", "text": outcome.parsed.content})
    for cid, call in zip(outcome.call_ids, outcome.parsed.tool_calls, strict=True):
        blocks.append({"type": "tool_use", "id": cid, "name": call.name, "input": call.arguments})
    return blocks


def response(outcome: Outcome, req: ApiRequest, model: str, rid: str, tokenizer: Any) -> dict:
    c = outcome.completion
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(outcome),
        "stop_reason": stop_reason(outcome),
        "stop_sequence": c.stop_sequence,
        "usage": {"input_tokens": c.prompt_tokens, "output_tokens": len(c.ids)},
    }


class ChunkWriter:
    """Builds the `message_start` … `message_stop` events of one streamed message.

    Text streams into its content block as it is generated; reasoning and tool calls are known
    only once the output is complete and follow as their own blocks.
    """

    def __init__(self, model: str, rid: str, req: ApiRequest, tokenizer: Any) -> None:
        self.model, self.rid = model, rid
        self.text_index: int | None = None
        self.next_index = 0

    def start(self, prompt_tokens: int) -> bytes:
        message: dict[str, Any] = {
            "id": self.rid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }
        return sse({"type": "message_start", "message": message}, "message_start")

    def text(self, delta: str, ids: list[int] | None = None, logprobs: Any = None) -> bytes:
        """A text delta (Anthropic streams no log-probs)."""
        out = b""
        if self.text_index is None:
            self.text_index = self.next_index
            self.next_index += 1
            out += sse(
                {
                    "type": "content_block_start",
                    "index": self.text_index,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
        if delta:
            out += sse(
                {
                    "type": "content_block_delta",
                    "index": self.text_index,
                    "delta": {"type": "text_delta", "text": delta},
                },
                "content_block_delta",
            )
        return out

    def finish(self, outcome: Outcome, remaining_text: str) -> bytes:
        out = b""
        partial = [c.partial for c in outcome.parsed.tool_calls]
        for block in content_blocks(outcome):
            if block["type"] == "text":
                out += self.text(remaining_text)
                out += sse(
                    {"type": "content_block_stop", "index": self.text_index}, "content_block_stop"
                )
                continue
            i = self.next_index
            self.next_index += 1
            if block["type"] == "tool_use":
                start = {**block, "input": {}}
                cut = partial.pop(0)  # a cut call streams its JSON text as sampled
                raw = cut if cut is not None else json.dumps(block["input"])
                deltas = [{"type": "input_json_delta", "partial_json": raw}]
            else:
                start = {**block, "thinking": ""}
                deltas = [
                    {"type": "thinking_delta", "thinking": block["thinking"]},
                    {"type": "signature_delta", "signature": block["signature"]},
                ]
            out += sse(
                {"type": "content_block_start", "index": i, "content_block": start},
                "content_block_start",
            )
            for delta in deltas:
                out += sse(
                    {"type": "content_block_delta", "index": i, "delta": delta},
                    "content_block_delta",
                )
            out += sse({"type": "content_block_stop", "index": i}, "content_block_stop")
        c = outcome.completion
        out += sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(outcome), "stop_sequence": c.stop_sequence},
                "usage": {"output_tokens": len(c.ids)},
            },
            "message_delta",
        )
        return out

    def end(self) -> bytes:
        return sse({"type": "message_stop"}, "message_stop")

    def error(self, status: int, message: str) -> bytes:
        return sse(error_body(status, message), "error")


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        409: "invalid_request_error",
        413: "request_too_large",
        501: "api_error",
        529: "overloaded_error",
    }.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def models(model_name: str) -> dict[str, Any]:
    entry = {
        "type": "model",
        "id": model_name,
        "display_name": model_name,
        "created_at": "1970-01-01T00:00:00Z",
    }
    return {"data": [entry], "has_more": False, "first_id": model_name, "last_id": model_name}


DIALECT = Dialect(
    endpoint="messages",
    response_id_prefix="msg_",
    tool_call_id_prefix="toolu_",
    parse_request=parse_request,
    response=response,
    chunk_writer=ChunkWriter,
    error_body=error_body,
    models=models,
)
