"""The OpenAI Chat Completions surface: request parsing, responses and stream chunks.

`response_format` (`json_object`, `json_schema`) becomes the JSON schema the engine enforces
(`ApiRequest.output_schema`). Streamed chunks carry the log-probs of the tokens sampled since
the previous chunk when `logprobs` is asked for (all chunks together: the non-streamed list);
a tool call streams as its id and name, then its arguments.
"""

from __future__ import annotations

import time
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
    token_logprobs,
)
from tracerl.gateway.generation import SamplingSpec
from tracerl.gateway.messages import BadRequest, openai_messages, openai_tools

UNSUPPORTED = ("presence_penalty", "frequency_penalty")


def parse_request(body: dict[str, Any]) -> ApiRequest:
    n = integer(body, "n", 1)
    if n not in (None, 1):
        raise BadRequest("n", f"only n=1 is supported, got {n}")
    for name in UNSUPPORTED:
        if body.get(name):
            raise BadRequest(name, "is not supported by this gateway")
    if body.get("top_logprobs"):
        raise BadRequest("top_logprobs", "is not supported (logprobs of sampled tokens only)")
    tool_choice = body.get("tool_choice")
    tools = [] if tool_choice == "none" else openai_tools(body)
    if tool_choice in (None, "auto", "none"):
        forced = None
    elif tool_choice == "required":
        forced = forced_tool("required", None, tools, "tool_choice")
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        chosen = fn.get("name") if isinstance(fn, dict) else None
        forced = forced_tool("function", chosen, tools, "tool_choice.function.name")
    else:
        raise BadRequest("tool_choice", "expected 'auto', 'none', 'required' or a named function")
    max_tokens = integer(body, "max_completion_tokens", 1) or integer(body, "max_tokens", 1)
    budget = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
    stream_options = body.get("stream_options") or {}
    return ApiRequest(
        messages=openai_messages(body),
        tools=tools,
        spec=SamplingSpec(
            max_new_tokens=max_tokens,
            temperature=number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=number(body, "top_p", 1.0, 1e-9, 1.0),
            seed=integer(body, "seed", -(2**63)),
            stop=stop_strings(body.get("stop"), "stop"),
        ),
        stream=bool(body.get("stream", False)),
        include_usage=bool(
            isinstance(stream_options, dict) and stream_options.get("include_usage")
        ),
        want_logprobs=bool(body.get("logprobs", False)),
        max_tokens_param=budget,
        forced_tool=forced,
        output_schema=output_schema(body.get("response_format"), "response_format", "json_schema"),
    )


def finish_reason(outcome: Outcome) -> str:
    return outcome.finish  # "tool_calls" | "stop" | "length" | "abort" (engine aborted)


def usage(outcome: Outcome) -> dict[str, int]:
    c = outcome.completion
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": len(c.ids),
        "total_tokens": c.prompt_tokens + len(c.ids),
    }


def _logprobs(tokenizer: Any, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    return {"content": token_logprobs(tokenizer, ids, logprobs), "refusal": None}


def response(outcome: Outcome, req: ApiRequest, model: str, rid: str, tokenizer: Any) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": outcome.parsed.content or None}
    if outcome.has_calls:
        message["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            }
            for cid, call in zip(outcome.call_ids, outcome.parsed.tool_calls, strict=True)
        ]
    if outcome.parsed.reasoning is not None:
        message["reasoning_content"] = outcome.parsed.reasoning
    c = outcome.completion
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason(outcome),
                "logprobs": _logprobs(tokenizer, c.ids, c.logprobs) if req.want_logprobs else None,
            }
        ],
        "usage": usage(outcome),
    }


class ChunkWriter:
    """Builds the `chat.completion.chunk` events of one streamed response."""

    def __init__(self, model: str, rid: str, req: ApiRequest, tokenizer: Any) -> None:
        self.model, self.rid, self.include_usage = model, rid, req.include_usage
        self.want_logprobs, self.tokenizer = req.want_logprobs, tokenizer
        self.created = int(time.time())
        self.sent_tokens = 0  # sampled tokens whose log-probs went out

    def _chunk(
        self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
    ) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return sse(
            {
                "id": self.rid,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
            }
        )

    def _new_logprobs(self, ids: list[int], logprobs: list[float]) -> Any:
        """The log-probs of the tokens sampled since the last chunk that carried some."""
        if not self.want_logprobs:
            return None
        start, self.sent_tokens = self.sent_tokens, max(self.sent_tokens, len(ids))
        return _logprobs(self.tokenizer, ids[start:], logprobs[start : len(ids)])

    def start(self, prompt_tokens: int) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def text(self, delta: str, ids: list[int], logprobs: list[float]) -> bytes:
        return self._chunk({"content": delta}, logprobs=self._new_logprobs(ids, logprobs))

    def finish(self, outcome: Outcome, remaining_text: str) -> bytes:
        c, out = outcome.completion, b""
        if outcome.parsed.reasoning is not None:
            out += self._chunk({"reasoning_content": outcome.parsed.reasoning})
        if remaining_text:
            out += self.text(remaining_text, c.ids, c.logprobs)
        for i, (cid, call) in enumerate(
            zip(outcome.call_ids, outcome.parsed.tool_calls, strict=True)
        ):
            head = {"index": i, "id": cid, "type": "function"}
            name = {"name": call.name, "arguments": ""}
            out += self._chunk({"tool_calls": [{**head, "function": name}]})
            arguments = {"index": i, "function": {"arguments": call.arguments_json}}
            out += self._chunk({"tool_calls": [arguments]})
        # what no text delta carried (a reply that streamed no text: a tool call, reasoning)
        out += self._chunk({}, finish_reason(outcome), self._new_logprobs(c.ids, c.logprobs))
        if self.include_usage:
            out += sse(
                {
                    "id": self.rid,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": usage(outcome),
                }
            )
        return out

    def end(self) -> bytes:
        return b"data: [DONE]\n\n"

    def error(self, status: int, message: str) -> bytes:
        return sse(error_body(status, message))


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        409: "conflict_error",
        413: "invalid_request_error",
        501: "not_implemented",
    }.get(status, "server_error" if status >= 500 else "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def models(model_name: str) -> dict[str, Any]:
    entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "tracerl"}
    return {"object": "list", "data": [entry]}


DIALECT = Dialect(
    endpoint="chat.completions",
    response_id_prefix="chatcmpl-",
    tool_call_id_prefix="call_",
    parse_request=parse_request,
    response=response,
    chunk_writer=ChunkWriter,
    error_body=error_body,
    models=models,
)
