"""Formats whose calls carry their arguments as a JSON object after family-specific markup.

- Llama 3.1-3.3 (`llama3`): a reply that is a call is `{"name": NAME, "parameters": {...}}`,
  optionally after `<|python_tag|>`, several separated by `;`; the turn ends at `<|eot_id|>`
  or `<|eom_id|>`. Tool results are the template's `ipython` turns.
- Mistral (`mistral`): `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` (the v3 and
  v7 tokenizers), or `NAME[ARGS]{...}` per call (v11 and later: Mistral Small 3.2, Magistral,
  Devstral); reasoning in `[THINK]…[/THINK]`. Its templates require call ids of nine letters
  and digits: OpenAI-style ids are mapped to such ids, the same id to the same one.
- DeepSeek V3, V3.1 and R1 (`deepseek`): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME
  <｜tool▁sep｜>{...}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` (V3's `function<｜tool▁sep｜>NAME`
  with the arguments in a ```json block is read too); reasoning in `<think>…</think>`. Its
  templates take arguments as JSON text and render no tool list, so the list goes into the
  system message in the layout of DeepSeek's model card.

A forced call is written up to its arguments and the model samples them under the tool's
schema, as for Hermes.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Callable
from typing import Any

from tracerl.formats.base import (
    ChatFormat,
    ForcedCall,
    ParsedCall,
    arguments_schema,
    json_call,
    named_call,
    tool_named,
)


def map_calls(
    messages: list[dict[str, Any]], change: Callable[[dict[str, Any]], dict[str, Any]]
) -> list[dict[str, Any]]:
    """`messages` with `change` applied to each assistant tool call (copies; none changed)."""
    return [
        {**m, "tool_calls": [change(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
        for m in messages
    ]


def _any_call(tools: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """A schema for a call object of any of `tools`, arguments under `key`."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                key: arguments_schema(t),
            },
            "required": ["name", key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


class Llama3(ChatFormat):
    name = "llama3"
    stop_tokens = ("<|eot_id|>", "<|eom_id|>")
    special_markup = True
    tag = "<|python_tag|>"

    def parse_calls(
        self, text: str, cut: bool, tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[ParsedCall]]:
        body = text.strip()
        if body.startswith(self.tag):
            body = body[len(self.tag) :].strip()
        if not body.startswith("{"):
            return text, []
        parts = [p for p in re.split(r"\}\s*;\s*\{", body)]
        pieces = [
            ("" if i == 0 else "{") + p + ("" if i == len(parts) - 1 else "}")
            for i, p in enumerate(parts)
        ]
        calls = [
            json_call(piece, cut and i == len(pieces) - 1, "parameters")
            for i, piece in enumerate(pieces)
        ]
        if any(c is None for c in calls):
            return text, []  # not (all) calls: the reply is text
        return "", [c for c in calls if c is not None]

    def forced_call(self, name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
        if name is None:
            return ForcedCall("", _any_call(tools, "parameters"))
        schema = arguments_schema(tool_named(name, tools))
        return ForcedCall(f'{{"name": {json.dumps(name)}, "parameters": ', schema)


_ID_CHARS = string.ascii_letters + string.digits


def nine_char_id(call_id: str) -> str:
    """A call id as Mistral's templates require it: nine letters and digits (an id that is one
    already is kept)."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    digest = hashlib.sha256(call_id.encode()).digest()
    return "".join(_ID_CHARS[b % len(_ID_CHARS)] for b in digest[:9])


class Mistral(ChatFormat):
    name = "mistral"
    think = ("[THINK]", "[/THINK]")
    special_markup = True
    marker, args = "[TOOL_CALLS]", "[ARGS]"

    def __init__(self, named_calls: bool = False) -> None:
        """`named_calls`: the v11 `NAME[ARGS]{...}` layout (its template says `[ARGS]`)."""
        self.named_calls = named_calls

    def parse_calls(
        self, text: str, cut: bool, tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[ParsedCall]]:
        start = text.find(self.marker)
        if start < 0:
            return text, []
        content, rest = text[:start], text[start:]
        chunks = [c for c in rest.split(self.marker) if c.strip()]
        calls: list[ParsedCall] = []
        for i, chunk in enumerate(chunks):
            last = cut and i == len(chunks) - 1
            if self.args in chunk:
                name, _, raw = chunk.partition(self.args)
                call = named_call(name, raw, last)
                if call is None:
                    return text, []
                calls.append(call)
                continue
            listed = self._listed(chunk.strip(), last)
            if listed is None:
                return text, []
            calls += listed
        return content, calls

    @staticmethod
    def _listed(chunk: str, cut: bool) -> list[ParsedCall] | None:
        try:
            value = json.loads(chunk)
        except json.JSONDecodeError:
            if not cut or not chunk.startswith("["):
                return None
            # a cut list: the complete calls, then the one in progress
            items = re.split(r"\}\s*,\s*\{", chunk[1:])
            found = [
                json_call(("" if i == 0 else "{") + item + ("" if i == len(items) - 1 else "}"),
                          i == len(items) - 1)
                for i, item in enumerate(items)
            ]  # fmt: skip
            return [c for c in found if c is not None] or None
        value = value if isinstance(value, list) else [value]
        calls = [json_call(json.dumps(v), False) for v in value]
        return None if any(c is None for c in calls) else [c for c in calls if c is not None]

    def forced_call(self, name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
        if self.named_calls:
            if name is None:
                return ForcedCall(self.marker, None)  # the name is free text before [ARGS]
            return ForcedCall(
                f"{self.marker}{name}{self.args}", arguments_schema(tool_named(name, tools))
            )
        if name is None:
            return ForcedCall(f"{self.marker}[", _any_call(tools, "arguments"))
        schema = arguments_schema(tool_named(name, tools))
        return ForcedCall(f'{self.marker}[{{"name": {json.dumps(name)}, "arguments": ', schema)

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = map_calls(messages, lambda c: {**c, "id": nine_char_id(str(c.get("id", "")))})
        return [
            {**m, "tool_call_id": nine_char_id(str(m["tool_call_id"]))}
            if m["role"] == "tool" and m.get("tool_call_id")
            else m
            for m in out
        ]


class DeepSeek(ChatFormat):
    name = "deepseek"
    think = ("<think>", "</think>")
    special_markup = True
    begin, end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    call_begin, call_end, sep = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
    _fenced = re.compile(r"\s*function\s*$")

    def parse_calls(
        self, text: str, cut: bool, tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[ParsedCall]]:
        start = text.find(self.begin)
        if start < 0:
            return text, []
        content, rest = text[:start], text[start + len(self.begin) :].split(self.end)[0]
        pieces = [p for p in rest.split(self.call_begin) if p.strip()]
        calls: list[ParsedCall] = []
        for i, piece in enumerate(pieces):
            last = cut and i == len(pieces) - 1
            complete = self.call_end in piece
            body = piece.split(self.call_end)[0]
            name, marker, raw = body.partition(self.sep)
            if not marker:
                return (content, calls) if last else (text, [])
            if self._fenced.match(name):  # V3: function<sep>NAME\n```json\n{...}\n```
                name, _, raw = raw.partition("\n")
                raw = raw.strip().removeprefix("```json").removesuffix("```")
            call = named_call(name, raw, last and not complete)
            if call is None:
                return text, []
            calls.append(call)
        return content, calls

    def forced_call(self, name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
        if name is None:
            return ForcedCall(self.begin + self.call_begin, None)
        prefix = f"{self.begin}{self.call_begin}{name}{self.sep}"
        return ForcedCall(prefix, arguments_schema(tool_named(name, tools)))

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        def as_text(call: dict[str, Any]) -> dict[str, Any]:
            function = call["function"]
            return {
                **call,
                "function": {**function, "arguments": json.dumps(function["arguments"])},
            }

        return map_calls(messages, as_text)

    def with_tools(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        if not tools:
            return messages
        listing = "\n\n".join(
            f"### {t['function']['name']}\n"
            f"Description: {t['function'].get('description', '')}\n\n"
            f"Parameters: {json.dumps(arguments_schema(t))}"
            for t in tools
        )
        prompt = (
            "## Tools\nYou have access to the following tools:\n\n"
            f"{listing}\n\n"
            "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
            f"{self.begin}{self.call_begin}tool_call_name{self.sep}tool_call_arguments"
            f"{self.call_end}{{{{additional_tool_calls}}}}{self.end}\n\n"
            "Where:\n- `tool_call_name` must be an exact match to one of the available tools\n"
            "- `tool_call_arguments` must be valid JSON that strictly follows the tool's "
            "Parameters Schema\n"
            "- For multiple tool calls, chain them directly without separators or spaces"
        )
        if messages and messages[0]["role"] == "system":
            first = {**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}
            return [first, *messages[1:]]
        return [{"role": "system", "content": prompt}, *messages]
