"""Reading the gateway's event streams for `test_stream_conformance`: SSE frames, each API's
events validated against its SDK's models, reduced to what the goldens compare (consecutive deltas
merged, as that module's doc says), and the streamed reply rebuilt by concatenation and by the SDK's
own accumulator."""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jiter
from anthropic.lib.streaming._messages import accumulate_event
from openai import omit
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.responses import (
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseStreamState,
    ResponseTextDeltaEvent,
)

from tests import sdk_models

# ------------------------------------------------------------------ server-sent events


@dataclass
class Frame:
    event: str | None
    data: str


def parse_sse(body: str) -> list[Frame]:
    """The frames of an event stream, as the SSE format defines them: blocks separated by a
    blank line, `event:` and `data:` fields (several `data:` lines join with a newline), `:`
    comments ignored. Any other field is an error: no client expects one here."""
    assert body.endswith("\n\n"), f"the stream's last frame is unterminated: {body[-80:]!r}"
    frames = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        if not block:
            continue
        event, data = None, []
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            else:
                raise AssertionError(f"unexpected SSE line {line!r}")
        frames.append(Frame(event, "\n".join(data)))
    return frames


# ------------------------------------------------------------------ reduction to the goldens


def _no_nulls(value: Any) -> Any:
    """A delta without its null fields (a null says nothing in a delta) and with volatile ids."""
    if isinstance(value, dict):
        return {k: "<id>" if k == "id" else _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def chat_entry(chunk: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    choices = chunk["choices"]
    assert len(choices) <= 1, "n=1 was asked for"
    if not choices:
        entry["choices"] = []
    for choice in choices:
        entry["delta"] = _no_nulls(choice["delta"])
        if choice.get("finish_reason") is not None:
            entry["finish_reason"] = choice["finish_reason"]
        if choice.get("logprobs") is not None:
            entry["logprobs"] = [t["token"] for t in choice["logprobs"].get("content") or []]
    if chunk.get("usage") is not None:
        entry["usage"] = {"completion_tokens": chunk["usage"]["completion_tokens"]}
    return entry


def _chat_run(entry: dict[str, Any]) -> Any:
    """What a chunk is a delta of, when it carries nothing but that delta (else None)."""
    delta = entry.get("delta")
    if delta is None or set(entry) - {"delta", "logprobs"} or len(delta) != 1:
        return None
    (key,) = delta
    if key in ("content", "reasoning_content"):
        return key, "logprobs" in entry
    calls = delta.get("tool_calls")
    if (
        key == "tool_calls"
        and len(calls) == 1
        and set(calls[0]) == {"index", "function"}
        and set(calls[0]["function"]) == {"arguments"}
    ):
        return key, calls[0]["index"], "logprobs" in entry
    return None


def _merge_chat(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    (key,) = a["delta"]
    if key == "tool_calls":
        more = b["delta"][key][0]["function"]["arguments"]
        out["delta"][key][0]["function"]["arguments"] += more
    else:
        out["delta"][key] += b["delta"][key]
    if "logprobs" in a:
        out["logprobs"] += b["logprobs"]
    return out


def _part(part: dict[str, Any]) -> dict[str, Any]:
    out = {"type": part["type"], "text": part.get("text")}
    if part.get("logprobs"):  # the final output_text part's (include: output_text.logprobs)
        out["logprobs"] = [t["token"] for t in part["logprobs"]]
    return out


def _item(item: dict[str, Any]) -> dict[str, Any]:
    out = {"type": item["type"], "status": item.get("status")}
    if item["type"] == "message":
        out["content"] = [_part(p) for p in item["content"]]
    elif item["type"] == "function_call":
        out |= {"name": item["name"], "arguments": item["arguments"]}
    elif item["type"] == "reasoning":
        # content is optional on the model: absent and [] both say "nothing reasoned yet"
        out["content"] = [_part(p) for p in item.get("content") or []]
    return out


def _response(resp: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"status": resp["status"]}
    if resp.get("incomplete_details") is not None:
        out["incomplete_details"] = resp["incomplete_details"]
    out["output"] = [_item(i) for i in resp["output"]]
    return out


def responses_entry(event: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": event["type"]}
    if "response" in event:
        entry["response"] = _response(event["response"])
    for key in ("output_index", "content_index"):
        if key in event:
            entry[key] = event[key]
    if "item" in event:
        entry["item"] = _item(event["item"])
    if "part" in event:
        entry["part"] = _part(event["part"])
    for key in ("delta", "text", "arguments"):  # delta/done events' logprobs: unspecified
        if key in event:
            entry[key] = event[key]
    return entry


def _responses_run(entry: dict[str, Any]) -> Any:
    if not entry["type"].endswith(".delta"):
        return None
    return entry["type"], entry["output_index"], entry.get("content_index")


def _merge_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {**a, "delta": a["delta"] + b["delta"]}


def _block(block: dict[str, Any], signature: bool = True) -> dict[str, Any]:
    kind = block["type"]
    if kind == "tool_use":
        return {"type": kind, "name": block["name"], "input": block["input"]}
    keep = {"text": ["text"], "thinking": ["thinking"] + ["signature"] * signature}.get(kind, [])
    return {"type": kind, **{k: block.get(k) for k in keep}}


def messages_entry(event: dict[str, Any]) -> dict[str, Any]:
    kind = event["type"]
    entry: dict[str, Any] = {"type": kind}
    if kind == "message_start":
        message = event["message"]
        content = [_block(b) for b in message["content"]]
        entry["message"] = {"content": content, "stop_reason": message["stop_reason"]}
    if "index" in event:
        entry["index"] = event["index"]
    if kind == "content_block_start":
        entry["content_block"] = _block(event["content_block"])
    if kind == "content_block_delta":
        delta = dict(event["delta"])
        if delta["type"] == "signature_delta":  # opaque: any string
            delta["signature"] = "<signature>"
        entry["delta"] = delta
    if kind == "message_delta":
        entry["delta"] = {k: event["delta"].get(k) for k in ("stop_reason", "stop_sequence")}
    return entry


def _messages_run(entry: dict[str, Any]) -> Any:
    if entry["type"] != "content_block_delta":
        return None
    kind = entry["delta"]["type"]
    return (entry["index"], kind) if kind != "signature_delta" else None


def _merge_block_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    field = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
    key = field[a["delta"]["type"]]
    return {**a, "delta": {**a["delta"], key: a["delta"][key] + b["delta"][key]}}


def merge_runs(
    entries: list[Any], run: Callable[[Any], Any], merge: Callable[[Any, Any], Any]
) -> list[Any]:
    """Consecutive deltas of the same kind to the same target as one (how a run of deltas is
    split into events is not specified)."""
    out: list[Any] = []
    for entry in entries:
        key = run(entry) if isinstance(entry, dict) else None
        if out and key is not None and key == run(out[-1]):
            out[-1] = merge(out[-1], entry)
        else:
            out.append(entry)
    return out


# ------------------------------------------------------------------ per-API checks


@dataclass
class Checked:
    """A stream reduced for its golden, and what it says next to the non-streamed reply."""

    entries: list[Any]
    problems: list[str]
    reply: dict[str, Any]
    """The streamed reply from its concatenated deltas (in the shape of the API's `reply_of`)."""
    sdk_reply: dict[str, Any] | None
    """The same as the SDK's own stream accumulator builds it (None: it could not)."""


def _validated(
    frames: list[Frame], validate: Callable[[Any], Any], problems: list[str]
) -> list[tuple[dict[str, Any], Any]]:
    """(data, model or None) of every frame: a rejected event is a problem, not a stop, so one
    run reports all of them."""
    out = []
    for i, frame in enumerate(frames):
        data = json.loads(frame.data)
        try:
            out.append((data, validate(data)))
        except sdk_models.SdkModelError as e:
            problems.append(f"event {i} ({data.get('type', 'chunk')}): {e}")
            out.append((data, None))
    return out


def _named_events(
    frames: list[Frame], validate: Callable[[Any], Any]
) -> tuple[list[str], list[tuple[dict[str, Any], Any]]]:
    """(problems, events) of a Responses or Anthropic stream: each event `_validated`, and the
    framing those streams have: each event named in an `event:` line, and no `[DONE]` (their
    last event ends the stream)."""
    problems: list[str] = []
    events = _validated([f for f in frames if f.data != "[DONE]"], validate, problems)
    if any(f.data == "[DONE]" for f in frames):
        problems.append("`data: [DONE]` in a stream whose last event ends it")
    for frame, (event, _) in zip([f for f in frames if f.data != "[DONE]"], events, strict=True):
        if frame.event != event["type"]:
            problems.append(f"`event: {frame.event}` frames a {event['type']} event")
    return problems, events


def chat_reply_of(body: dict[str, Any]) -> dict[str, Any]:
    (choice,) = body["choices"]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    return {
        "content": message.get("content") or "",
        "reasoning_content": message.get("reasoning_content"),
        "tool_calls": [(c["function"]["name"], c["function"]["arguments"]) for c in calls],
        "finish_reason": choice["finish_reason"],
        "logprobs": (choice.get("logprobs") or {}).get("content"),
    }


def _chat_sdk_reply(state: ChatCompletionStreamState[Any]) -> dict[str, Any]:
    snapshot = state.current_completion_snapshot  # get_final_completion refuses "length"
    (choice,) = snapshot.choices
    message, logprobs = choice.message, choice.logprobs
    return {
        "content": message.content or "",
        "reasoning_content": (message.model_extra or {}).get("reasoning_content"),
        "tool_calls": [
            (c.function.name, c.function.arguments)
            for c in message.tool_calls or []
            if c.type == "function"
        ],
        "finish_reason": choice.finish_reason,
        "logprobs": None if logprobs is None else [t.model_dump() for t in logprobs.content or []],
    }


def check_chat(frames: list[Frame], body: dict[str, Any]) -> Checked:
    problems: list[str] = []
    if any(f.event is not None for f in frames):
        problems.append("`event:` lines in a Chat Completions stream")
    done = [i for i, f in enumerate(frames) if f.data == "[DONE]"]
    if done != [len(frames) - 1]:
        problems.append(f"`data: [DONE]` must end the stream, once; found at {done}")
    chunks = _validated([f for f in frames if f.data != "[DONE]"], sdk_models.chat_chunk, problems)
    if len({(c["id"], c["created"]) for c, _ in chunks}) != 1:
        problems.append("the chunks of one stream differ in id or created")
    reply: dict[str, Any] = {"content": "", "reasoning_content": None}
    reply |= {"finish_reason": None, "logprobs": None}
    calls: dict[int, list[str]] = {}
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    sdk_ok = bool(chunks)
    for chunk, model in chunks:
        sdk_ok = sdk_ok and model is not None
        try:
            if sdk_ok:
                state.handle_chunk(model)
        except (RuntimeError, TypeError, IndexError) as e:
            problems.append(f"the SDK's accumulator refused a chunk: {e!r}")
            sdk_ok = False
        usage = chunk.get("usage")
        if usage is not None and usage != body["usage"]:
            problems.append(f"streamed usage {usage} != non-streamed {body['usage']}")
        for choice in chunk["choices"]:
            delta = choice["delta"]
            reply["content"] += delta.get("content") or ""
            reasoning = delta.get("reasoning_content")
            if reasoning is not None:
                reply["reasoning_content"] = (reply["reasoning_content"] or "") + reasoning
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                name_args = calls.setdefault(call["index"], ["", ""])
                name_args[0] += fn.get("name") or ""
                name_args[1] += fn.get("arguments") or ""
            reply["finish_reason"] = choice.get("finish_reason") or reply["finish_reason"]
            if choice.get("logprobs") is not None:
                tokens = choice["logprobs"].get("content") or []
                reply["logprobs"] = (reply["logprobs"] or []) + tokens
    reply["tool_calls"] = [tuple(calls[i]) for i in sorted(calls)]
    entries: list[Any] = [chat_entry(c) for c, _ in chunks] + ["[DONE]"] * len(done)
    entries = merge_runs(entries, _chat_run, _merge_chat)
    return Checked(entries, problems, reply, _chat_sdk_reply(state) if sdk_ok else None)


def responses_reply_of(body: dict[str, Any]) -> dict[str, Any]:
    return _response(body)


def check_responses(frames: list[Frame], body: dict[str, Any]) -> Checked:
    problems, events = _named_events(frames, sdk_models.responses_event)
    kinds = [e["type"] for e, _ in events]
    numbers = [e.get("sequence_number") for e, _ in events]
    if numbers != list(range(len(events))):
        problems.append(f"sequence numbers {numbers}, not 0..{len(events) - 1}")
    terminal = [k for k in kinds if k in ("response.completed", "response.incomplete")]
    if len(terminal) != 1 or kinds[-1] != terminal[0]:
        problems.append(f"one response.completed / response.incomplete must end it: {kinds}")
    responses = [e["response"] for e, _ in events if "response" in e]
    if len({r["id"] for r in responses}) != 1:
        problems.append("the response objects of one stream differ in id")
    floats = [r["created_at"] for r in responses if type(r["created_at"]) is not int]
    if floats:
        problems.append(f"streamed created_at is not an integer: {floats[0]!r}")
    item_ids: dict[Any, str] = {}  # by output index
    deltas: dict[tuple[Any, Any], str] = {}  # by (output, content index): text or arguments
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    snapshots: dict[int, str] = {}  # the SDK's accumulated text / arguments, per output index
    sdk_ok = True
    for event, model in events:
        index = event.get("output_index")
        if event["type"] == "response.output_item.added":
            item_ids[index] = event["item"].get("id")
        elif "item" in event and event["item"].get("id") != item_ids.get(index):
            problems.append(f"{event['type']}: not the id of the item added at {index}")
        if "item_id" in event and event["item_id"] != item_ids.get(index):
            problems.append(f"{event['type']}: item_id is not that of output {index}")
        if event["type"].endswith(".delta"):
            key = (index, event.get("content_index"))
            deltas[key] = deltas.get(key, "") + event["delta"]
        sdk_ok = sdk_ok and model is not None
        if not sdk_ok:
            continue
        try:
            for fired in state.handle_event(model):
                # the deltas the SDK accumulates, each with the text or arguments so far
                if isinstance(
                    fired, ResponseTextDeltaEvent | ResponseFunctionCallArgumentsDeltaEvent
                ):
                    snapshots[fired.output_index] = fired.snapshot
        except (RuntimeError, AssertionError, IndexError) as e:
            problems.append(f"the SDK's accumulator refused {event['type']}: {e!r}")
            sdk_ok = False
    # the streamed reply: the terminal response's items with their text and arguments as the
    # deltas built them (not as the final object restates them)
    reply = _response(responses[-1] if responses else {"status": None, "output": []})
    sdk_reply = copy.deepcopy(reply)
    for index, item in enumerate(reply["output"]):
        if item["type"] == "function_call":
            item["arguments"] = deltas.get((index, None), "")
            sdk_reply["output"][index]["arguments"] = snapshots.get(index, "")
        for k, part in enumerate(item.get("content", [])):
            part["text"] = deltas.get((index, k), "")
            if item["type"] == "message":  # the SDK accumulates message text, not reasoning
                sdk_reply["output"][index]["content"][k]["text"] = snapshots.get(index, "")
    entries = merge_runs([responses_entry(e) for e, _ in events], _responses_run, _merge_delta)
    return Checked(entries, problems, reply, sdk_reply if sdk_ok else None)


def messages_reply_of(body: dict[str, Any]) -> dict[str, Any]:
    # a thinking block's signature is opaque, and may differ between two replies
    content = [_block(b, signature=False) for b in body["content"]]
    return {"content": content, "stop_reason": body["stop_reason"]}


def check_messages(frames: list[Frame], body: dict[str, Any]) -> Checked:
    problems, events = _named_events(frames, sdk_models.messages_event)
    kinds = [e["type"] for e, _ in events]
    if not kinds or kinds[0] != "message_start" or kinds[-1] != "message_stop":
        problems.append(f"message_start must open it and message_stop end it: {kinds}")
    blocks: dict[int, dict[str, Any]] = {}
    json_text: dict[int, str] = {}
    snapshot: Any = None
    json_bufs: dict[int, bytes] = {}
    sdk_ok = True
    stop_reason = None
    for event, model in events:
        if event["type"] == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif event["type"] == "content_block_delta":
            block, delta = blocks.setdefault(event["index"], {}), event["delta"]
            for key in ("text", "thinking"):
                if key in delta:
                    block[key] = block.get(key, "") + delta[key]
            if "partial_json" in delta:
                json_text[event["index"]] = (
                    json_text.get(event["index"], "") + delta["partial_json"]
                )
        elif event["type"] == "message_delta":
            stop_reason = event["delta"].get("stop_reason")
        sdk_ok = sdk_ok and model is not None
        if not sdk_ok:
            continue
        try:
            snapshot = accumulate_event(event=model, current_snapshot=snapshot, json_bufs=json_bufs)
        except (RuntimeError, ValueError, IndexError) as e:
            problems.append(f"the SDK's accumulator refused {event['type']}: {e!r}")
            sdk_ok = False
    for index, text in json_text.items():  # read as the SDK reads it: partial JSON allowed
        try:
            blocks[index]["input"] = jiter.from_json(text.encode(), partial_mode=True)
        except ValueError as e:
            problems.append(f"block {index}'s input_json_delta is not (partial) JSON: {e}")
            blocks[index]["input"] = text
    content = [_block(blocks[i], signature=False) for i in sorted(blocks)]
    reply = {"content": content, "stop_reason": stop_reason}
    sdk_reply = messages_reply_of(snapshot.to_dict()) if sdk_ok and snapshot else None
    entries = merge_runs([messages_entry(e) for e, _ in events], _messages_run, _merge_block_delta)
    return Checked(entries, problems, reply, sdk_reply)


CHECKS = {"chat": check_chat, "responses": check_responses, "messages": check_messages}
REPLY_OF = {"chat": chat_reply_of, "responses": responses_reply_of, "messages": messages_reply_of}
VALIDATE_BODY = {
    "chat": sdk_models.chat_completion,
    "responses": sdk_models.response,
    "messages": sdk_models.message,
}


def _lines(entries: list[Any]) -> list[str]:
    return [json.dumps(e, sort_keys=True) for e in entries]  # key order is no difference


def golden_diff(expected: list[Any], actual: list[Any]) -> str:
    diff = difflib.unified_diff(
        _lines(expected), _lines(actual), "golden", "stream", n=1, lineterm=""
    )
    return "\n".join(diff)
