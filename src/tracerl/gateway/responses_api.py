"""The OpenAI Responses surface (`POST /v1/responses`): request parsing, the Response object and
its stream of events.

Input items become the chat form in `messages.py` (messages, `function_call` and
`function_call_output` items; reasoning items are not fed back); `instructions` is a system
message first. Only function tools reach the model: a client's other tools (web search,
namespaces, custom grammars) are dropped from the prompt. `previous_response_id` is resolved by
the server from the session's recorded turns (`history`), so a chain of responses renders as
one conversation and is recorded as one trajectory.

`text.format` (`json_object`, `json_schema`) becomes the JSON schema the engine enforces.

Output: a reasoning item (templates with `<think>`), a message item with one `output_text`
part, then one `function_call` item per call, with ids derived from the response's id so the
streamed items, the final response and the recorded one agree. A generation cut by its token
budget is `status: "incomplete"` (`incomplete_details.reason: "max_output_tokens"`), as the
real API answers, and so is a function call it cut (its arguments as sampled so far). Streams
are `event:` + `data:` frames with a `sequence_number`, from `response.created` to exactly one
of `response.completed` / `response.incomplete` / `response.failed`, and no `[DONE]`; every
item is added in progress and ends with `response.output_item.done` (the event Codex reads its
items from), a function call's arguments streamed between the two.
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
    token_logprobs,
)
from tracerl.gateway.generation import SamplingSpec
from tracerl.gateway.messages import (
    BadRequest,
    call_arguments,
    responses_messages,
    responses_tools,
)
from tracerl.gateway.openai_api import models

UNSUPPORTED = {
    "background": "background responses are not supported",
    "conversation": "server-side conversations are not supported (use previous_response_id)",
    "prompt": "prompt templates are not supported",
}


def parse_request(body: dict[str, Any]) -> ApiRequest:
    for name, why in UNSUPPORTED.items():
        if body.get(name):
            raise BadRequest(name, why)
    if body.get("top_logprobs"):
        raise BadRequest("top_logprobs", "is not supported (logprobs of sampled tokens only)")
    text = body.get("text") or {}
    if not isinstance(text, dict):
        raise BadRequest("text", "expected an object")
    choice = body.get("tool_choice")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise BadRequest("previous_response_id", "expected a response id")
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions", "expected a string")
        messages.append({"role": "system", "content": instructions})
    if "input" not in body:
        raise BadRequest("input", "is required")
    include = body.get("include") or []
    if not isinstance(include, list):
        raise BadRequest("include", "expected a list")
    tools = [] if choice == "none" else responses_tools(body)
    if choice in (None, "auto", "none"):
        forced = None
    elif choice == "required":
        forced = forced_tool("required", None, tools, "tool_choice")
    elif isinstance(choice, dict) and choice.get("type") == "function":
        forced = forced_tool("function", choice.get("name"), tools, "tool_choice.name")
    else:
        raise BadRequest("tool_choice", "expected 'auto', 'none', 'required' or a function")
    return ApiRequest(
        messages=messages + responses_messages(body["input"]),
        tools=tools,
        forced_tool=forced,
        spec=SamplingSpec(
            max_new_tokens=integer(body, "max_output_tokens", 1),
            temperature=number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=number(body, "top_p", 1.0, 1e-9, 1.0),
        ),
        stream=bool(body.get("stream", False)),
        include_usage=True,
        want_logprobs="message.output_text.logprobs" in include,
        extra={"previous_response_id": previous, "history_at": len(messages), "body": body},
        max_tokens_param="max_output_tokens",
        output_schema=output_schema(text.get("format"), "text.format", None),
        output_schema_param="text.format",
    )


def history(request: dict[str, Any], response: dict[str, Any]) -> list[dict[str, Any]]:
    """One recorded response's conversation after its instructions: its input, then its
    output as the assistant message it was (what the next response in a chain continues)."""
    messages = responses_messages(request.get("input", []))
    return [*messages, output_message(response.get("output") or [])]


class PreviousNotFound(LookupError):
    """A `previous_response_id` this session has no (stored) response for."""


async def chain(store: Any, state: Any, response_id: str) -> list[dict[str, Any]]:
    """The conversation a chain of responses ending at `response_id` had: every earlier
    response's input and output, from the session's recorded turns in `store` (`state`: the
    session, None for untraced use, which has none). A response stored with `store: false`,
    or one of another session, cannot be continued, as on the real API."""
    turns = await store.turns(state.session_id) if state is not None else []
    by_id = {t.response.get("id"): t for t in turns if t.endpoint == "responses"}
    messages: list[dict[str, Any]] = []
    seen: set[str] = set()
    current: str | None = response_id
    while current is not None:
        turn = by_id.get(current)
        if turn is None or turn.request.get("store") is False or current in seen:
            raise PreviousNotFound(f"Previous response with id '{current}' not found.")
        seen.add(current)
        messages[:0] = history(turn.request, turn.response)
        current = turn.request.get("previous_response_id")
    return messages


async def with_references_resolved(store: Any, state: Any, body: dict[str, Any]) -> dict[str, Any]:
    """`body` with each `item_reference` input item replaced by the item it names: an output
    item of a response this session recorded (clients that keep `store` on, such as the
    Vercel AI SDK, refer to earlier output that way). What is recorded is the resolved body,
    so a later `previous_response_id` chain reads it as it was shown to the model."""
    items = body.get("input")
    if not isinstance(items, list) or not any(
        isinstance(i, dict) and i.get("type") == "item_reference" for i in items
    ):
        return body
    turns = await store.turns(state.session_id) if state is not None else []
    known = {
        item.get("id"): item
        for t in turns
        if t.endpoint == "responses" and t.request.get("store") is not False
        for item in t.response.get("output") or []
    }
    resolved = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            found = known.get(item.get("id"))
            if found is None:
                raise BadRequest(
                    f"input.{i}.id", f"no stored item of this session has id {item.get('id')!r}"
                )
            item = found
        resolved.append(item)
    return {**body, "input": resolved}


def output_message(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A response's output items as one assistant message in the chat form (reasoning left
    out, as the other surfaces feed none back)."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in items:
        if item.get("type") == "message":
            parts = item.get("content") or []
            message["content"] += "".join(
                str(p.get("text", "")) for p in parts if p.get("type") == "output_text"
            )
        elif item.get("type") == "function_call":
            arguments = call_arguments(item["arguments"], "previous_response_id")
            call = {"name": item["name"], "arguments": arguments}
            message.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": call}
            )
    return message


def _suffix(rid: str) -> str:
    return rid.removeprefix("resp_")


def _status(outcome: Outcome) -> tuple[str, dict[str, str] | None]:
    finish = outcome.finish
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "abort":
        return "incomplete", {"reason": "interrupted"}
    return "completed", None


def usage(outcome: Outcome) -> dict[str, Any]:
    c = outcome.completion
    return {
        "input_tokens": c.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": len(c.ids),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": c.prompt_tokens + len(c.ids),
    }


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def output_items(outcome: Outcome, rid: str, logprobs: Any = None) -> list[dict[str, Any]]:
    suffix, items = _suffix(rid), []
    if outcome.parsed.reasoning is not None:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{suffix}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": outcome.parsed.reasoning}],
                "status": "completed",
            }
        )
    if outcome.parsed.content or not outcome.has_calls:
        items.append(_message_item(rid, outcome.parsed.content, "completed", logprobs))
    for cid, call in zip(outcome.call_ids, outcome.parsed.tool_calls, strict=True):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{cid.removeprefix('call_')}",
                "call_id": cid,
                "name": call.name,
                "arguments": call.arguments_json,
                "status": "completed" if call.partial is None else "incomplete",
            }
        )
    return items


def _message_item(rid: str, text: str, status: str, logprobs: Any = None) -> dict[str, Any]:
    content = [_text_part(text, logprobs)] if status == "completed" else []
    return {
        "type": "message",
        "id": f"msg_{_suffix(rid)}",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _event_logprobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Log-prob entries as the text events carry them: an output_text part's entries have the
    token's `bytes`, the delta and done events' do not."""
    return [{k: v for k, v in e.items() if k != "bytes"} for e in entries]


def response_object(
    req: ApiRequest, model: str, rid: str, created: int, tokenizer: Any,
    outcome: Outcome | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The Response: in progress (no outcome yet) or finished."""
    body: dict[str, Any] = req.extra.get("body", {})
    status, incomplete = _status(outcome) if outcome is not None else ("in_progress", None)
    logprobs = None
    if outcome is not None and req.want_logprobs:
        logprobs = token_logprobs(tokenizer, outcome.completion.ids, outcome.completion.logprobs)
    text = body.get("text") or {}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": output_items(outcome, rid, logprobs) if outcome is not None else [],
        "usage": usage(outcome) if outcome is not None else None,
        "incomplete_details": incomplete,
        "error": None,
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "max_output_tokens": body.get("max_output_tokens"),
        "text": {"format": text.get("format") or {"type": "text"}},
        "reasoning": body.get("reasoning"),
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
    }


def response(outcome: Outcome, req: ApiRequest, model: str, rid: str, tokenizer: Any) -> dict:
    created = req.extra.get("created", int(time.time()))
    return response_object(req, model, rid, created, tokenizer, outcome)


class ChunkWriter:
    """The events of one streamed response. Text streams into the message item as it is
    generated; reasoning and tool calls are known once the output is complete and follow as
    their own items, each added in progress, its content streamed, then done."""

    def __init__(self, model: str, rid: str, req: ApiRequest, tokenizer: Any) -> None:
        self.model, self.rid, self.req, self.tokenizer = model, rid, req, tokenizer
        self.created = int(req.extra.setdefault("created", int(time.time())))
        self.sequence = 0
        self.text_index: int | None = None  # the message item's, once its events began
        self.sent_tokens = 0  # sampled tokens whose log-probs went out with a delta
        self.final: dict[str, Any] = {}

    def _event(self, kind: str, **fields: Any) -> bytes:
        out = sse({"type": kind, **fields, "sequence_number": self.sequence}, event=kind)
        self.sequence += 1
        return out

    def _response(self, outcome: Outcome | None = None) -> dict[str, Any]:
        req, tokenizer = self.req, self.tokenizer
        return response_object(req, self.model, self.rid, self.created, tokenizer, outcome)

    def start(self, prompt_tokens: int) -> bytes:
        head = self._response()
        return self._event("response.created", response=head) + self._event(
            "response.in_progress", response=head
        )

    def _open_text(self, index: int) -> bytes:
        self.text_index = index
        item = _message_item(self.rid, "", "in_progress")
        return self._event(
            "response.output_item.added", output_index=index, item=item
        ) + self._event(
            "response.content_part.added", item_id=item["id"], output_index=index,
            content_index=0, part=_text_part(""),
        )  # fmt: skip

    def text(self, delta: str, ids: list[int], logprobs: list[float]) -> bytes:
        """Streamed text: the message is the first item whenever text streams (templates
        with reasoning stream none: their text follows the reasoning item at the end)."""
        out = self._open_text(0) if self.text_index is None else b""
        new: list[dict[str, Any]] = []
        if self.req.want_logprobs:
            start, self.sent_tokens = self.sent_tokens, max(self.sent_tokens, len(ids))
            entries = token_logprobs(self.tokenizer, ids[start:], logprobs[start : len(ids)])
            new = _event_logprobs(entries)
        return out + self._event(
            "response.output_text.delta", item_id=f"msg_{_suffix(self.rid)}",
            output_index=self.text_index, content_index=0, delta=delta, logprobs=new,
        )  # fmt: skip

    def finish(self, outcome: Outcome, remaining_text: str) -> bytes:
        final = self._response(outcome)
        out = b""
        for index, item in enumerate(final["output"]):
            if item["type"] == "message":
                out += self._message_events(index, item, remaining_text, outcome)
                continue
            ids = {"item_id": item["id"], "output_index": index}
            if item["type"] == "function_call":
                started = {**item, "arguments": "", "status": "in_progress"}
                out += self._event("response.output_item.added", output_index=index, item=started)
                out += self._event(
                    "response.function_call_arguments.delta", **ids, delta=item["arguments"]
                )
                out += self._event(
                    "response.function_call_arguments.done", **ids, arguments=item["arguments"]
                )
            else:  # reasoning
                started = {**item, "content": [], "status": "in_progress"}
                out += self._event("response.output_item.added", output_index=index, item=started)
                text = item["content"][0]["text"]
                ids["content_index"] = 0
                out += self._event("response.reasoning_text.delta", **ids, delta=text)
                out += self._event("response.reasoning_text.done", **ids, text=text)
            out += self._event("response.output_item.done", output_index=index, item=item)
        self.final = final
        return out

    def _message_events(
        self, index: int, item: dict[str, Any], remaining: str, outcome: Outcome
    ) -> bytes:
        """The message item's remaining events (its streamed text went out at `index`)."""
        out = self._open_text(index) if self.text_index is None else b""
        if remaining:
            c = outcome.completion
            out += self.text(remaining, c.ids, c.logprobs)
        part = item["content"][0]
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        out += self._event(
            "response.output_text.done",
            **ids,
            text=part["text"],
            logprobs=_event_logprobs(part["logprobs"]),
        )
        out += self._event("response.content_part.done", **ids, part=part)
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def end(self) -> bytes:
        """The terminal event, once the turn is recorded (the Responses API sends no
        `[DONE]`: this event ends the stream)."""
        final = self.final
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return self._event(kind, response=final)

    def error(self, status: int, message: str) -> bytes:
        failed = self._response()
        failed["status"] = "failed"
        failed["error"] = {"code": _code(status, None), "message": message}
        return self._event("response.failed", response=failed)


def _code(status: int, param: str | None) -> str:
    if status == 404 and param == "previous_response_id":
        return "previous_response_not_found"
    if status == 400 and param == "input":
        return "invalid_prompt"
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "invalid_request_error"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    return {
        "error": {"message": message, "type": kind, "param": param, "code": _code(status, param)}
    }


DIALECT = Dialect(
    endpoint="responses",
    response_id_prefix="resp_",
    tool_call_id_prefix="call_",
    parse_request=parse_request,
    response=response,
    chunk_writer=ChunkWriter,
    error_body=error_body,
    models=models,
)
