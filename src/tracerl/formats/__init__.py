"""Chat formats: how each model family writes reasoning and tool calls in its replies, which
tokens end its turn, and how a call is forced (`tracerl.formats.base.ChatFormat`).

`format_for` picks one from the chat template (each family's template spells its own call
markup), or by name (`gateway.chat_format`, `trainer.chat_format`):

- `hermes`: `<tool_call>` JSON blocks, `<think>` where the template has it (SmolLM2, Qwen2.5,
  Qwen3, tracerl's own `chatml` and `gemma` templates)
- `qwen3_coder`: `<function=NAME><parameter=KEY>` blocks (Qwen3-Coder, Qwen3.5, Qwen3.6)
- `llama3`: `{"name", "parameters"}` objects, `<|python_tag|>` (Llama 3.1-3.3)
- `mistral`: `[TOOL_CALLS]` (Mistral, Mixtral, Mistral Small, Magistral, Devstral)
- `deepseek`: `<｜tool▁call▁begin｜>` (DeepSeek V3, V3.1, R1)
- `glm`: `<arg_key>`/`<arg_value>` (GLM-4.5, 4.6, 4.7)
- `harmony`: channels and `to=functions.NAME` (gpt-oss)
"""

from __future__ import annotations

from tracerl.formats.base import ChatFormat, ForcedCall, ParsedCall, ParsedOutput
from tracerl.formats.harmony import Harmony
from tracerl.formats.hermes import Hermes
from tracerl.formats.json_calls import DeepSeek, Llama3, Mistral
from tracerl.formats.xml_calls import Glm, Qwen3Coder

FORMAT_NAMES = ("auto", "hermes", "qwen3_coder", "llama3", "mistral", "deepseek", "glm", "harmony")


def format_for(template: str, name: str = "auto") -> ChatFormat:
    """The format `name` names, or (`auto`) the one the chat template's markup shows."""
    if name == "auto":
        name = detect(template)
    if name == "hermes":
        return Hermes(thinking="<think>" in template)
    if name == "mistral":
        return Mistral(named_calls="[ARGS]" in template)
    formats: dict[str, type[ChatFormat]] = {
        "qwen3_coder": Qwen3Coder,
        "llama3": Llama3,
        "deepseek": DeepSeek,
        "glm": Glm,
        "harmony": Harmony,
    }
    if name not in formats:
        raise ValueError(f"{name!r} is not a chat format ({', '.join(FORMAT_NAMES)})")
    return formats[name]()


def detect(template: str) -> str:
    """The format a chat template writes calls in; `hermes` when it shows none (its fallback
    tool prompt teaches the model Hermes blocks)."""
    if "<|channel|>" in template:
        return "harmony"
    if "tool▁calls▁begin" in template:
        return "deepseek"
    if "<arg_key>" in template:
        return "glm"
    if "<function=" in template:
        return "qwen3_coder"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "<|eom_id|>" in template or "ipython" in template:
        return "llama3"
    return "hermes"


__all__ = [
    "FORMAT_NAMES",
    "ChatFormat",
    "ForcedCall",
    "ParsedCall",
    "ParsedOutput",
    "detect",
    "format_for",
]
