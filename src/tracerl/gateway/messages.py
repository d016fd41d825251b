"""OpenAI (Chat Completions, Responses) and Anthropic request bodies → one chat form the
model's template renders.

The chat form is the Hugging Face one: `{"role", "content": str}` plus, for assistant messages,
`tool_calls` (`{"id", "type": "function", "function": {"name", "arguments": dict}}`) and, for
tool results, `tool_call_id`. Content-part lists and Anthropic blocks are flattened to text;
images are rejected (the built-in models have no vision). Errors name the offending field.
"""

from __future__ import annotations

import json
from typing import Any

from tracerl.formats.base import partial_arguments


class BadRequest(ValueError):
    """A request the gateway rejects with 400; `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


CHAT_PARTS = {"text": "text"}
"""Chat Completions content parts that carry text: part type -> its text field."""
RESPONSES_PARTS = {
    "input_text": "text",
    "output_text": "text",
    "text": "text",
    "refusal": "refusal",
}
MEDIA_PARTS = ("image_url", "image", "input_audio", "document", "file", "input_image", "input_file")


def _text_parts(content: Any, param: str, kinds: dict[str, str] = CHAT_PARTS) -> str:
    """A string, or a list of text parts joined (`kinds`: the part types that carry text, and
    the field each keeps it in); media parts and unknown types are a 400 naming the part."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(param, "expected a string or a list of content parts")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in kinds:
            texts.append(str(part.get(kinds[kind], "")))
        elif kind in MEDIA_PARTS:
            raise BadRequest(
                f"{param}.{i}",
                f"{kind} content is not supported: the model has no vision or audio input",
            )
        else:
            raise BadRequest(f"{param}.{i}", f"unknown content part type {kind!r}")
    return "".join(texts)


def call_arguments(raw: Any, param: str) -> dict[str, Any]:
    """A call's arguments: an object, or its JSON text. Text that is not a whole object is a
    call its budget cut, echoed back as it was returned: read as far as it goes, as the reply
    was (`partial_arguments`: {} when not even that is an object, e.g. a cut `"arguments":
    "12 + 3"`), so that every call the gateway returns can come back."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return partial_arguments(raw)
        return value if isinstance(value, dict) else {}  # whole, yet no object
    raise BadRequest(param, "tool call arguments must be a JSON object or its text")


def openai_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages", "expected a non-empty list")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(raw):
        param = f"messages.{i}"
        if not isinstance(msg, dict):
            raise BadRequest(param, "expected an object")
        role = msg.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"{param}.role", f"unknown role {role!r}")
        item: dict[str, Any] = {
            "role": role,
            "content": _text_parts(msg.get("content"), f"{param}.content"),
        }
        if role == "assistant" and msg.get("tool_calls"):
            calls = []
            for j, call in enumerate(msg["tool_calls"]):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest(f"{param}.tool_calls.{j}", "expected a function call")
                calls.append(
                    {
                        "id": str(call.get("id", "")),
                        "type": "function",
                        "function": {
                            "name": fn["name"],
                            "arguments": call_arguments(
                                fn.get("arguments"), f"{param}.tool_calls.{j}.arguments"
                            ),
                        },
                    }
                )
            item["tool_calls"] = calls
        if role == "tool":
            item["tool_call_id"] = str(msg.get("tool_call_id", ""))
        out.append(item)
    return out


def openai_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest("tools", "expected a list")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(f"tools.{i}", 'expected {"type": "function", "function": {...}}')
        out.append(_function_tool(fn["name"], fn.get("description"), fn.get("parameters")))
    return out


def _function_tool(name: str, description: Any, parameters: Any) -> dict[str, Any]:
    """A tool in the chat form templates take (OpenAI's function shape)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description or "",
            "parameters": parameters or {"type": "object", "properties": {}},
        },
    }


def anthropic_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _anthropic_text(system, "system")})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages", "expected a non-empty list")
    for i, msg in enumerate(raw):
        param = f"messages.{i}"
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant", "system"):
            raise BadRequest(f"{param}.role", "expected role 'user', 'assistant' or 'system'")
        content = msg.get("content")
        if msg["role"] == "system":  # Claude Code's mid-conversation system: where it stands
            out.append({"role": "system", "content": _anthropic_text(content, f"{param}.content")})
            continue
        if isinstance(content, str):
            out.append({"role": msg["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise BadRequest(f"{param}.content", "expected a string or a list of blocks")
        if msg["role"] == "assistant":
            out.append(_anthropic_assistant(content, param))
        else:
            out.extend(_anthropic_user(content, param))
    return out


def _anthropic_text(value: Any, param: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, block in enumerate(value):
            if not isinstance(block, dict) or block.get("type") != "text":
                kind = block.get("type") if isinstance(block, dict) else block
                raise BadRequest(f"{param}.{i}", f"expected a text block, got {kind!r}")
            texts.append(str(block.get("text", "")))
        return "".join(texts)
    raise BadRequest(param, "expected a string or a list of text blocks")


def _anthropic_assistant(blocks: list[Any], param: str) -> dict[str, Any]:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": call_arguments(
                            block.get("input", {}), f"{param}.content.{j}.input"
                        ),
                    },
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # reasoning is not fed back to the model
        else:
            raise BadRequest(f"{param}.content.{j}", f"unsupported assistant block {kind!r}")
    item: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        item["tool_calls"] = calls
    return item


def _anthropic_user(blocks: list[Any], param: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_result":
            result = _anthropic_text(block.get("content") or "", f"{param}.content.{j}.content")
            if block.get("is_error"):
                result = f"Error: {result}"
            out.append(
                {
                    "role": "tool",
                    "content": result,
                    "tool_call_id": str(block.get("tool_use_id", "")),
                }
            )
        elif kind in ("image", "document"):
            raise BadRequest(
                f"{param}.content.{j}",
                f"{kind} blocks are not supported: the model has no vision input",
            )
        else:
            raise BadRequest(f"{param}.content.{j}", f"unsupported user block {kind!r}")
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def anthropic_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest("tools", "expected a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools.{i}", 'expected {"name", "input_schema"}')
        out.append(_function_tool(tool["name"], tool.get("description"), tool.get("input_schema")))
    return out


RESPONSES_IGNORED_ITEMS = ("reasoning",)
"""Input items the model is not shown: reasoning is not fed back (as for the other APIs)."""
RESPONSES_FUNCTION_TOOLS = ("function",)


def responses_messages(value: Any, param: str = "input") -> list[dict[str, Any]]:
    """Responses API input (a string, or a list of items) in the chat form: messages,
    `function_call` items as the preceding assistant message's tool calls, and
    `function_call_output` items as tool messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise BadRequest(param, "expected a string or a list of input items")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"{param}.{i}"
        if not isinstance(item, dict):
            raise BadRequest(where, "expected an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_responses_message(item, where))
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id", "")),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": call_arguments(item.get("arguments"), f"{where}.arguments"),
                },
            }
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = _text_parts(item.get("output"), f"{where}.output", RESPONSES_PARTS)
            out.append(
                {"role": "tool", "content": output, "tool_call_id": str(item.get("call_id", ""))}
            )
        elif kind in RESPONSES_IGNORED_ITEMS:
            continue
        else:
            raise BadRequest(f"{where}.type", f"input items of type {kind!r} are not supported")
    if not out:
        raise BadRequest(param, "expected at least one message")
    return out


def _responses_message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant"):
        raise BadRequest(f"{where}.role", f"unknown role {role!r}")
    return {
        "role": role,
        "content": _text_parts(item.get("content"), f"{where}.content", RESPONSES_PARTS),
    }


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where}.{name}", "expected a non-empty string")
    return value


def responses_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Function tools (flat: `{"type": "function", "name", "description", "parameters"}`).
    Tools of other types (web search, namespaces, custom grammars, ...) are the client's own
    and are not offered to the model."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest("tools", "expected a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise BadRequest(f"tools.{i}", "expected an object")
        if tool.get("type") not in RESPONSES_FUNCTION_TOOLS:
            continue
        name = _string(tool, "name", f"tools.{i}")
        out.append(_function_tool(name, tool.get("description"), tool.get("parameters")))
    return out


def canonical_assistant(message: dict[str, Any]) -> str:
    """A key equal for an assistant message however the client echoes it back (ids ignored)."""
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]
    return json.dumps({"content": message.get("content") or "", "calls": calls}, sort_keys=True)
