"""Model output text → the API's shapes: content, tool calls and reasoning.

Tool calls use the Hermes convention of `render.py`: `<tool_call>{"name", "arguments"}</tool_call>`
(a last block without its closing tag is read too). A block whose JSON is malformed (beyond up
to two missing closing braces, which are added), or lacks a string `name` and object
`arguments`, stays in the text: parsing never fails. Reasoning (`<think>…</think>` at the
start) is split off only for templates that use it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class ParsedCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedOutput:
    content: str
    tool_calls: list[ParsedCall] = field(default_factory=list)
    reasoning: str | None = None


def parse_output(text: str, reasoning: bool = False) -> ParsedOutput:
    thought = None
    if reasoning and text.lstrip().startswith(THINK_OPEN) and THINK_CLOSE in text:
        head, _, text = text.lstrip()[len(THINK_OPEN) :].partition(THINK_CLOSE)
        thought = head.strip()
        text = text.lstrip()
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
        call = _read_call(rest[start + len(CALL_OPEN) :])
        if call is not None:
            calls.append(call)
            rest = rest[:start]
    kept.append(rest)
    return ParsedOutput(content="".join(kept).rstrip(), tool_calls=calls, reasoning=thought)


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
