"""Chat messages → prompt text and tokens with the model's chat template, and the tool fallback.

Tools are rendered by the template when it handles them. When it does not (SmolLM2's template
ignores `tools`), one documented fallback is used, the Hermes/ChatML convention: the tool list
goes into the system message inside `<tools>…</tools>`, assistant calls are written as
`<tool_call>{"name": …, "arguments": {…}}</tool_call>`, and tool results are `tool` messages
wrapped in `<tool_response>…</tool_response>`. `parse.py` reads model output the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from tracerl.engine.detokenize import safe_decode
from tracerl.gateway.parse import CALL_OPEN

TOOL_SYSTEM_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


class ChatRenderer:
    """Renders with one tokenizer's chat template; knows whether that template handles tools."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        template = tokenizer.chat_template or ""
        if not template or not isinstance(template, str):
            raise ValueError("the tokenizer has no (single) chat template")
        self.template = template
        self.native_tools = "tools" in template
        self.reasoning = "<think>" in template
        backend = getattr(tokenizer, "_tokenizer", None)
        self._fast = getattr(backend, "encode_batch_fast", None)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        """The prompt text, ending with the template's generation prompt."""
        if not self.native_tools:
            messages = hermes_messages(messages, tools)
            tools = []
        # transformers' own renderer (what apply_chat_template calls), minus its per-call overhead
        renderer: Any = render_jinja_template  # annotated as returning str; returns a pair
        rendered, _ = renderer(
            conversations=[messages],
            tools=tools or None,
            chat_template=self.template,
            add_generation_prompt=True,
            **self.tokenizer.special_tokens_map,
        )
        return str(rendered[0])

    def tokenize(self, text: str) -> list[int]:
        """Token ids of rendered text (special-token markup such as `<|im_start|>` included).

        Uses the Rust tokenizer's offset-free batch encoder when there is one: the same ids as
        the tokenizer's `__call__` at about 60 % of the cost, and it releases the GIL.
        """
        if self._fast is not None:
            return list(self._fast([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return safe_decode(self.tokenizer, ids, skip_special_tokens=skip_special_tokens)


@dataclass(frozen=True)
class ForcedCall:
    """A reply that must be a tool call: `prefix` is written into the prompt (context, never
    sampled) and the model continues it under `schema`, a JSON schema for the rest of the call
    that engines enforce (`sampling_params.json_schema`)."""

    prefix: str
    schema: dict[str, Any]


def forced_call(name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
    """The forced call for the tool `name`, or for any of `tools` (`name` None).

    A named tool's call is written up to its arguments (`<tool_call>` and `{"name": "X",
    "arguments": `), and the model samples the arguments object under the tool's parameters
    schema; the call's closing brace, which the schema cannot ask for, is read by `parse.py`.
    For any tool the prompt ends at `<tool_call>` and the model samples the whole call object,
    the name among the tools' and the arguments under that tool's schema.
    """
    if name is not None:
        tool = next(t for t in tools if t["function"]["name"] == name)
        return ForcedCall(
            f'{CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": ', _arguments_schema(tool)
        )
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": _arguments_schema(t),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return ForcedCall(f"{CALL_OPEN}\n", calls[0] if len(calls) == 1 else {"anyOf": calls})


def _arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters schema, an object unless it says otherwise (calls carry objects)."""
    schema = dict(tool["function"].get("parameters") or {})
    schema.setdefault("type", "object")
    return schema


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
