"""gpt-oss's harmony format (`harmony`), read from the sampled text.

After the generation prompt `<|start|>assistant`, a reply is one or more messages, each
`<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY` ended by `<|end|>` (more
follows, after `<|start|>assistant`), `<|call|>` (a tool call: the turn ends) or `<|return|>`
(the final answer: the turn ends). The recipient may also stand before the channel
(`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`). The `analysis`
channel is reasoning, `final` is content, and a `commentary` message addressed to
`functions.NAME` is a call whose body is its JSON arguments (without a recipient it is a
preamble, content).

Parsed from the text by hand, like every other format here: openai-harmony, OpenAI's parser,
reads token ids of the o200k vocabulary, which it downloads at first use unless
`TIKTOKEN_ENCODINGS_BASE` names a directory holding `o200k_base.tiktoken`; adopting it (with
that file built offline) is left for later.
"""

from __future__ import annotations

import re
from typing import Any

from tracerl.formats.base import (
    ChatFormat,
    ForcedCall,
    ParsedCall,
    ParsedOutput,
    arguments_schema,
    named_call,
    tool_named,
)

_MESSAGE = re.compile(
    r"(?P<head>.*?)<\|message\|>(?P<body>.*?)(?P<end><\|end\|>|<\|call\|>|<\|return\|>|$)",
    re.DOTALL,
)
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


class Harmony(ChatFormat):
    name = "harmony"
    stop_tokens = ("<|call|>", "<|return|>")
    message_ends = ("<|end|>",)
    special_markup = True
    echo_raw = False  # the template writes channels itself: raw markup would be nested in one

    def parse(
        self, text: str, cut: bool = False, tools: list[dict[str, Any]] | None = None
    ) -> ParsedOutput:
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ParsedCall] = []
        for match in _MESSAGE.finditer(text.replace("<|start|>assistant", "")):
            head, body, end = match.group("head"), match.group("body"), match.group("end")
            if not head and not body:
                continue
            channel = _CHANNEL.search(head)
            recipient = _RECIPIENT.search(head)
            if recipient is not None:
                # not JSON although it ended: malformed, text; not ended: a call in progress
                call = named_call(recipient.group(1), body, cut and not end)
                if call is None:
                    content.append(body)
                else:
                    calls.append(call)
            elif channel is not None and channel.group(1) == "analysis":
                reasoning.append(body.strip())
            else:
                content.append(body)
        if not reasoning and not content and not calls:
            return ParsedOutput(text.strip())
        thought = "\n\n".join(r for r in reasoning if r) or None
        return ParsedOutput("\n\n".join(c.strip() for c in content if c.strip()), calls, thought)

    def forced_call(self, name: str | None, tools: list[dict[str, Any]]) -> ForcedCall:
        if name is None:
            return ForcedCall("<|channel|>commentary to=functions.", None)
        return ForcedCall(
            f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",
            arguments_schema(tool_named(name, tools)),
        )
