"""A turn's request and response as a conversation to read: messages of roles with their text,
tool calls and tool results, whichever API recorded them (OpenAI chat completions, Anthropic
messages, OpenAI Responses).

Owns only this normalisation for display; the gateway's own (`tracerl.gateway.messages`) is
for rendering prompts and must stay exact, while this one must never fail on a shape it does
not know (it shows such a value as JSON).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

PartKind = Literal["text", "tool_call", "tool_result", "other"]


@dataclass
class Part:
    kind: PartKind
    text: str
    label: str = ""
    """The tool's name, or the call id a result answers."""


@dataclass
class Message:
    role: str
    parts: list[Part] = field(default_factory=list)


def _json(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=1, ensure_ascii=False)


def _call(function: dict[str, Any], call_id: str | None = None) -> Part:
    name = str(function.get("name", "?"))
    arguments = function.get("arguments", function.get("input", ""))
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # not JSON: shown as the model wrote it
            arguments = json.loads(arguments)
    return Part("tool_call", _json(arguments), f"{name}" + (f" ({call_id})" if call_id else ""))


def _content_parts(content: Any) -> list[Part]:
    """OpenAI content (a string or parts) or Anthropic blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [Part("text", content)]
    if not isinstance(content, list):
        return [Part("other", _json(content))]
    parts = []
    for block in content:
        if not isinstance(block, dict):
            parts.append(Part("other", _json(block)))
            continue
        kind = block.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append(Part("text", str(block.get("text", ""))))
        elif kind == "thinking":
            parts.append(Part("text", str(block.get("thinking", "")), "thinking"))
        elif kind == "tool_use":
            parts.append(_call(block, block.get("id")))
        elif kind == "tool_result":
            inner = _content_parts(block.get("content"))
            text = "\n".join(p.text for p in inner)
            parts.append(Part("tool_result", text, str(block.get("tool_use_id", ""))))
        else:
            parts.append(Part("other", _json(block)))
    return parts


def _chat_message(message: dict[str, Any]) -> Message:
    role = str(message.get("role", "?"))
    if role == "tool":
        text = "\n".join(p.text for p in _content_parts(message.get("content")))
        return Message(role, [Part("tool_result", text, str(message.get("tool_call_id", "")))])
    parts = _content_parts(message.get("content"))
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            parts.append(_call(call.get("function") or {}, call.get("id")))
    return Message(role, parts)


def _responses_item(item: Any) -> Message:
    if not isinstance(item, dict):
        return Message("user", _content_parts(item if isinstance(item, str) else [item]))
    kind = item.get("type", "message")
    if kind == "function_call":
        return Message("assistant", [_call(item, item.get("call_id"))])
    if kind == "function_call_output":
        text = _json(item.get("output", ""))
        return Message("tool", [Part("tool_result", text, str(item.get("call_id", "")))])
    if kind == "message":
        return Message(str(item.get("role", "?")), _content_parts(item.get("content")))
    return Message(str(kind), [Part("other", _json(item))])


def request_messages(request: dict[str, Any]) -> list[Message]:
    """The messages a turn's request sent (system prompt and tools list excluded from the
    latter: tools show as their names)."""
    out: list[Message] = []
    system = request.get("system", request.get("instructions"))
    if system:
        out.append(Message("system", _content_parts(system)))
    if isinstance(request.get("messages"), list):
        out += [_chat_message(m) for m in request["messages"] if isinstance(m, dict)]
    elif "input" in request:
        items = request["input"]
        out += [_responses_item(i) for i in (items if isinstance(items, list) else [items])]
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        names = [
            str((t.get("function") or t).get("name", "?")) for t in tools if isinstance(t, dict)
        ]
        out.append(Message("tools", [Part("other", ", ".join(names))]))
    return out


def response_messages(response: dict[str, Any]) -> list[Message]:
    """What the model answered in a turn's response."""
    if isinstance(response.get("choices"), list):
        return [
            _chat_message(c.get("message") or {})
            for c in response["choices"]
            if isinstance(c, dict)
        ]
    if isinstance(response.get("content"), list):
        return [
            Message(str(response.get("role", "assistant")), _content_parts(response["content"]))
        ]
    if isinstance(response.get("output"), list):
        return [_responses_item(i) for i in response["output"]]
    return [Message("response", [Part("other", _json(response))])]
