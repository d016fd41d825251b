"""Model output text → the API's shapes: content, tool calls and reasoning.

Tool calls use the Hermes convention of `render.py`: `<tool_call>{"name", "arguments"}</tool_call>`
(a last block without its closing tag is read too). A block whose JSON is malformed (beyond up
to two missing closing braces, which are added), or lacks a string `name` and object
`arguments`, stays in the text: parsing never fails. Reasoning (`<think>…</think>` at the
start) is split off only for templates that use it.

A reply its token budget cut (`cut`) inside a last call block is a call in progress, as the
real APIs return one: once its name is complete it is a call whose `partial` holds the
arguments' JSON text as sampled so far (read as far as it goes into `arguments`); before that
it is nothing. Either way its markup is not content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pydantic_core

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
"""A call object's start up to its arguments' value, the name complete."""


@dataclass
class ParsedCall:
    name: str
    arguments: dict[str, Any]
    partial: str | None = None
    """A call cut by the token budget: its arguments' JSON text as sampled (it does not parse
    as it stands; `arguments` is what of it does). None for a complete call."""

    @property
    def arguments_json(self) -> str:
        """The arguments as the OpenAI APIs send them: JSON text, cut where sampling stopped."""
        return self.partial if self.partial is not None else json.dumps(self.arguments)


@dataclass
class ParsedOutput:
    content: str
    tool_calls: list[ParsedCall] = field(default_factory=list)
    reasoning: str | None = None


def parse_output(text: str, reasoning: bool = False, cut: bool = False) -> ParsedOutput:
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
        body = rest[start + len(CALL_OPEN) :]
        call = _cut_call(body) if cut else _read_call(body)
        if call is not None:
            calls.append(call)
        if call is not None or cut:
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


def partial_arguments(raw: str) -> dict[str, Any]:
    """Cut JSON arguments read as far as they go (an unfinished string or number is left
    out, as the SDKs' own partial-JSON readers do); {} when not even that is an object."""
    try:
        value = pydantic_core.from_json(raw, allow_partial=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


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
