"""The Hermes format (ChatML models: SmolLM2, Qwen2.5, Qwen3 and its thinking template, and
tracerl's own `chatml` and `gemma` templates): calls are `<tool_call>{"name", "arguments"}
</tool_call>` (a last block without its closing tag is read too), reasoning `<think>…</think>`.

A template that renders no tools (SmolLM2's) gets the one documented fallback: the tool list
goes into the system message inside `<tools>…</tools>`, assistant calls are written as
`<tool_call>` blocks, and tool results are `tool` messages wrapped in
`<tool_response>…</tool_response>`.

A block whose JSON is malformed (beyond up to two missing closing braces, which are added), or
lacks a string `name` and object `arguments`, stays in the text: parsing never fails. Reasoning
is split off only for templates that use it.

A reply its token budget cut (`cut`) inside a last call block is a call in progress, as the
real APIs return one: once its name is complete it is a call whose `partial` holds the
arguments' JSON text as sampled so far (read as far as it goes into `arguments`); before that
it is nothing. Either way its markup is not content.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tracerl.formats.base import (
    ChatFormat,
    ForcedCall,
    ParsedCall,
    ParsedOutput,
    arguments_schema,
    partial_arguments,
    tool_named,
)

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
"""A call object's start up to its arguments' value, the name complete."""


def parse_output(text: str, cut: bool = False) -> ParsedOutput:
    """Content and `<tool_call>` blocks (reasoning is the format's: `ChatFormat.parse`)."""
    calls: list[ParsedCall] = []
    kept: list[str] = []
    last = 0
    for match in _CALL.finditer(text):
        call = _read_call(match.group(1))
        if call is None:
            continue  # malformed: stays as text
        kept.append(text[last : match.start()])
        calls.append(call)
        last = match.end()
    rest = text[last:]
    # a last call whose closing tag never came: a forced call ends with its value (the grammar
    # allows nothing after it), and models stop there too
    start = rest.find(CALL_OPEN)
    if start >= 0 and CALL_CLOSE not in rest[start:]:
        body = rest[start + len(CALL_OPEN) :]
        call = _cut_call(body) if cut else _read_call(body)
        if call is not None:
            calls.append(call)
        if call is not None or cut:
            rest = rest[:start]
    kept.append(rest)
    return ParsedOutput(content="".join(kept).rstrip(), tool_calls=calls)


def _read_call(body: str) -> ParsedCall | None:
    value = None
    # a call whose JSON ends before its last closing braces (small models drop them, often
    # after a forced `"arguments": ` prefix) is read with them added, up to two
    for closing in ("", "}", "}}"):
        try:
            value = json.loads(body.rstrip() + closing)
            break
        except json.JSONDecodeError:
            continue
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(value["name"], args)


def _cut_call(body: str) -> ParsedCall | None:
    """A last call block in a reply the budget cut: the call, once its name is complete;
    complete only when its arguments object is (no brace is added here: what is missing was
    cut, not forgotten)."""
    head = _CALL_HEAD.match(body)
    if head is None:
        return None
    name, raw = json.loads(head.group(1)), body[head.end() :]
    try:
        value, end = json.JSONDecoder().raw_decode(raw)
    except json.JSONDecodeError:
        value, end = None, 0
    if isinstance(value, dict) and raw[end:].strip() in ("", "}"):
        return ParsedCall(name, value)
    return ParsedCall(name, partial_arguments(raw), partial=raw)


def streamable_prefix(text: str) -> str:
    """The part of partial output that is safe to stream as content now: everything before a
    tool-call block (or a partial `<tool_call>` tag) and before trailing whitespace, which may
    turn out to precede a call."""
    cut = text.find(CALL_OPEN)
    if cut < 0:
        cut = len(text)
        for k in range(len(CALL_OPEN) - 1, 0, -1):
            if text.endswith(CALL_OPEN[:k]):
                cut = len(text) - k
                break
    return text[:cut].rstrip()


TOOL_SYSTEM_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def forced_call(name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
    """The forced call for the tool `name`, or for any of `tools` (`name` None).

    A named tool's call is written up to its arguments (`<tool_call>` and `{"name": "X",
    "arguments": `), and the model samples the arguments object under the tool's parameters
    schema; the call's closing brace, which the schema cannot ask for, is read by the parser.
    For any tool the prompt ends at `<tool_call>` and the model samples the whole call object,
    the name among the tools' and the arguments under that tool's schema.
    """
    if name is not None:
        return ForcedCall(
            f'{CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": ',
            arguments_schema(tool_named(name, tools)),
        )
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": arguments_schema(t),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return ForcedCall(f"{CALL_OPEN}\n", calls[0] if len(calls) == 1 else {"anyOf": calls})


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def hermes_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Rewrite tool definitions, calls and results as plain text in the Hermes convention."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        role, content = msg["role"], msg.get("content") or ""
        if role == "assistant" and msg.get("tool_calls"):
            calls = [
                hermes_call(c["function"]["name"], c["function"]["arguments"])
                for c in msg["tool_calls"]
            ]
            content = "\n".join([content, *calls]) if content else "\n".join(calls)
        elif role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    if tools:
        listing = "\n".join(json.dumps(t) for t in tools)
        tool_prompt = TOOL_SYSTEM_PROMPT.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tool_prompt}"}
        else:
            out.insert(0, {"role": "system", "content": tool_prompt})
    return out


class Hermes(ChatFormat):
    """`<tool_call>` JSON blocks; `<think>` reasoning where the template has it (`thinking`)."""

    name = "hermes"

    def __init__(self, thinking: bool = False) -> None:
        self.think = (THINK_OPEN, THINK_CLOSE) if thinking else None

    def parse_calls(
        self, text: str, cut: bool, tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[ParsedCall]]:
        out = parse_output(text, cut)
        return out.content, out.tool_calls

    def streamable(self, text: str) -> str | None:
        return None if self.think is not None else streamable_prefix(text)

    def forced_call(self, name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
        return forced_call(name, tools)

    def with_tools(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        return hermes_messages(messages, tools)
