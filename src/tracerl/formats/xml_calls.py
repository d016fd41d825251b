"""Formats whose calls name each argument in markup instead of a JSON object.

- Qwen3-Coder, Qwen3.5 and Qwen3.6 (`qwen3_coder`): `<tool_call>\\n<function=NAME>\\n
  <parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>`, reasoning in
  `<think>…</think>` (Qwen3.5's generation prompt opens it: the reply starts inside).
- GLM-4.5 and later (`glm`): `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE
  </arg_value>...</tool_call>` (newlines between the parts allowed), reasoning in
  `<think>…</think>`; the turn ends at `<|user|>` or `<|observation|>` (the next speaker's tag).

A value is the text as written where the tool's schema says the parameter is a string, and the
JSON value it spells otherwise (text that is not JSON stays text). A call forced by
`tool_choice` has its tool's name written into the prompt; its arguments cannot be held to the
schema by a JSON constraint, so they are the model's own.
"""

from __future__ import annotations

import re
from typing import Any

from tracerl.formats.base import (
    ChatFormat,
    ForcedCall,
    ParsedCall,
    parameter_schema,
    schema_value,
)

THINK = ("<think>", "</think>")


class _TaggedCalls(ChatFormat):
    """Calls in `<tool_call>` blocks whose bodies `_read` turns into a call or None."""

    think = THINK
    call_open, call_close = "<tool_call>", "</tool_call>"

    def parse_calls(
        self, text: str, cut: bool, tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[ParsedCall]]:
        kept: list[str] = []
        calls: list[ParsedCall] = []
        at = 0
        while True:
            start = text.find(self.call_open, at)
            if start < 0:
                break
            body_at = start + len(self.call_open)
            end = text.find(self.call_close, body_at)
            last = end < 0
            body = text[body_at:] if last else text[body_at:end]
            call = self._read(body, cut and last, tools)
            if call is None and not (last and cut):
                kept.append(text[at : (len(text) if last else end + len(self.call_close))])
                at = len(text) if last else end + len(self.call_close)
                continue
            kept.append(text[at:start])
            if call is not None:
                calls.append(call)
            at = len(text) if last else end + len(self.call_close)
        kept.append(text[at:])
        return "".join(kept), calls

    def _read(self, body: str, cut: bool, tools: list[dict[str, Any]] | None) -> ParsedCall | None:
        raise NotImplementedError


class Qwen3Coder(_TaggedCalls):
    name = "qwen3_coder"
    _function = re.compile(r"\s*<function=([^>\n]+)>")
    _parameter = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

    def _read(self, body: str, cut: bool, tools: list[dict[str, Any]] | None) -> ParsedCall | None:
        head = self._function.match(body)
        if head is None:
            return None
        name = head.group(1).strip()
        rest = body[head.end() :]
        if "</function>" not in rest and not cut:
            return None
        args = {
            key.strip(): schema_value(value, parameter_schema(name, key.strip(), tools))
            for key, value in self._parameter.findall(rest.split("</function>")[0])
        }
        return ParsedCall(name, args)

    def forced_call(self, name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
        if name is None:
            return ForcedCall("<tool_call>\n<function=", None)
        return ForcedCall(f"<tool_call>\n<function={name}>\n", None)


class Glm(_TaggedCalls):
    name = "glm"
    stop_tokens = ("<|user|>", "<|observation|>")
    special_markup = True
    _argument = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)

    def _read(self, body: str, cut: bool, tools: list[dict[str, Any]] | None) -> ParsedCall | None:
        name = body.partition("<arg_key>")[0].strip()
        if not name or any(c.isspace() or c in "<>{}" for c in name):
            return None
        args = {
            key.strip(): schema_value(value, parameter_schema(name, key.strip(), tools))
            for key, value in self._argument.findall(body)
        }
        return ParsedCall(name, args)

    def forced_call(self, name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
        return ForcedCall(f"<tool_call>{name or ''}", None)
