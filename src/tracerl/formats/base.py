"""What every chat format shares: the parsed reply, a forced call, and the base class.

A `ChatFormat` knows how one model family writes a reply: where its reasoning is, how its tool
calls are marked, which tokens end its turn, and how a call can be forced. Rendering the
conversation stays with the model's own chat template; a format only adapts messages to what
that template expects (`prepare`) and supplies the tool list when the template has no place
for one (`with_tools`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pydantic_core


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


@dataclass(frozen=True)
class ForcedCall:
    """A reply that must be a tool call: `prefix` is written into the prompt (context, never
    sampled) and the model continues it, under `schema` (a JSON schema engines enforce,
    `sampling_params.json_schema`) where the format's call body is JSON; None where it is not
    (an XML call: the prefix fixes the tool, the arguments are the model's)."""

    prefix: str
    schema: dict[str, Any] | None


def partial_arguments(raw: str) -> dict[str, Any]:
    """Cut JSON arguments read as far as they go (an unfinished string or number is left
    out, as the SDKs' own partial-JSON readers do); {} when not even that is an object."""
    try:
        value = pydantic_core.from_json(raw, allow_partial=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters schema, an object unless it says otherwise (calls carry objects)."""
    schema = dict(tool["function"].get("parameters") or {})
    schema.setdefault("type", "object")
    return schema


def tool_named(name: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    return next(t for t in tools if t["function"]["name"] == name)


def json_call(text: str, cut: bool, key: str = "arguments") -> ParsedCall | None:
    """A call written as one JSON object `{"name": ..., KEY: {...}}` (Llama 3's KEY is
    `parameters`); None when `text` is not one. Cut by the budget (`cut`), a call whose name is
    complete is a call in progress, its arguments as far as they were sampled."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        args = value.get(key, value.get("arguments", {}))
        if isinstance(args, str):  # some write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        return ParsedCall(value["name"], args) if isinstance(args, dict) else None
    head = re.match(rf'\s*\{{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"{key}"\s*:\s*', text)
    if not cut or head is None:
        return None
    raw = text[head.end() :]
    return ParsedCall(json.loads(head.group(1)), partial_arguments(raw), partial=raw)


def named_call(name: str, raw: str, cut: bool) -> ParsedCall | None:
    """A call written as its name and then its JSON arguments; None when they are not an
    object, unless the budget cut them (`cut`): then a call in progress."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return ParsedCall(name.strip(), partial_arguments(raw), partial=raw) if cut else None
    return ParsedCall(name.strip(), value) if isinstance(value, dict) else None


def schema_value(value: str, schema: dict[str, Any] | None) -> Any:
    """An XML-style call's parameter value: the text as is where the tool's schema says it is a
    string (or says nothing and it is not JSON), else the JSON value it spells."""
    kind = (schema or {}).get("type")
    if kind == "string":
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def parameter_schema(
    name: str, parameter: str, tools: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    for tool in tools or []:
        if tool["function"]["name"] == name:
            props = (tool["function"].get("parameters") or {}).get("properties") or {}
            found = props.get(parameter)
            return found if isinstance(found, dict) else None
    return None


class ChatFormat:
    """The Hermes-free defaults; each family's format overrides what differs."""

    name = "base"
    think: tuple[str, str] | None = None
    """Reasoning's opening and closing markers; None: the family writes none."""
    stop_tokens: tuple[str, ...] = ()
    """Tokens that end the model's turn besides the tokenizer's end-of-sequence token."""
    message_ends: tuple[str, ...] = ()
    """Markup that ends a rendered assistant message besides those tokens (harmony's `<|end|>`,
    which the template writes where the model sampled `<|return|>`)."""
    special_markup = False
    """Its call markup is made of special tokens: replies are parsed with them, not from the
    visible text (which drops them)."""
    echo_raw = True
    """An echoed reply is rendered as the text the model sampled (its markup as written), which
    the template reproduces; False where the template renders only structured messages."""

    def parse(
        self, text: str, cut: bool = False, tools: list[dict[str, Any]] | None = None
    ) -> ParsedOutput:
        """A reply's reasoning, content and tool calls. Parsing never fails: what is not a
        well-formed call stays content. `cut`: the budget ended the reply (a last call may
        be in progress); `tools`: the request's, for the types of XML-style values."""
        reasoning, rest = self.split_reasoning(text)
        content, calls = self.parse_calls(rest, cut, tools)
        return ParsedOutput(content.rstrip(), calls, reasoning)

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        if self.think is None:
            return None, text
        opening, closing = self.think
        stripped = text.lstrip()
        if stripped.startswith(opening) and closing in stripped:
            head, _, rest = stripped[len(opening) :].partition(closing)
            return head.strip(), rest.lstrip()
        if closing in text and opening not in text:  # the prompt opened it (Qwen3.5, GLM)
            head, _, rest = text.partition(closing)
            return head.strip(), rest.lstrip()
        return None, text

    def parse_calls(
        self, text: str, cut: bool, tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[ParsedCall]]:
        return text, []

    def streamable(self, text: str) -> str | None:
        """The part of a reply in progress that is content for sure; None: nothing can be
        streamed before the reply ends (a call may start anywhere, or only look like one at
        the end)."""
        return None

    def forced_call(self, name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
        raise NotImplementedError

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Canonical messages (arguments as objects, OpenAI call ids) as the family's
        template expects them."""
        return messages

    def with_tools(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """`messages` with the tool list written in, for a template that renders none."""
        return messages
