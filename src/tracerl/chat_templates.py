"""Chat templates tracerl ships, for models whose tokenizer has none (base models) or whose own
one a run replaces: `trainer.chat_template` takes one of these names or a Jinja file.

- `chatml`: `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n` per message, the assistant's turn opened by
  `<|im_start|>assistant\\n` (SmolLM2, Qwen). Tools are listed in the system turn as JSON inside
  `<tools></tools>`; an assistant's calls are `<tool_call>{"name": ..., "arguments": ...}
  </tool_call>` (Hermes), a tool's result a `tool` turn.
- `gemma`: Gemma 3's published turn format: `<start_of_turn>user\\nCONTENT<end_of_turn>\\n`,
  the model's turn opened by `<start_of_turn>model\\n`; a system message is prepended to the
  first user turn (Gemma has no system role); `<bos>` first. Tools and tool results use the
  ChatML layout's JSON blocks inside the turns (Gemma 3 defines no tool format of its own).
  The built-in `gemma3-270m` (a base model, no template) gets this one.

Written here rather than taken from a model card: a template is the contract between the
rendered prompt and what the gateway parses back, so the two live in one project.
"""

from __future__ import annotations

from pathlib import Path

_TOOLS = (
    "{%- if tools %}{{- '\\n\\n# Tools\\n\\nYou may call one or more functions. Function "
    "signatures are within <tools></tools>:\\n<tools>' }}{%- for tool in tools %}"
    "{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{{- '\\n</tools>\\n\\nFor each call, return "
    "a JSON object with the function name and arguments within <tool_call></tool_call>:\\n"
    '<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n'
    "</tool_call>' }}{%- endif %}"
)
_CALLS = (
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{%- set f = call.function if call.function is defined else call %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + f.name + \'", "arguments": \' }}'
    "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}"
    "{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}{%- endif %}"
)

CHATML = (
    "{%- if messages[0].role == 'system' or tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}"
    + _TOOLS
    + "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (loop.first and message.role == 'system') %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- endif %}"
    + _CALLS
    + "{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

GEMMA = (
    "{{- bos_token }}{%- set preamble %}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}"
    + _TOOLS
    + "{%- endset %}{%- set ns = namespace(preamble=preamble | trim) %}"
    "{%- for message in messages %}{%- if not (loop.first and message.role == 'system') %}"
    "{%- set role = 'model' if message.role == 'assistant' else 'user' %}"
    "{{- '<start_of_turn>' + role + '\\n' }}"
    "{%- if role == 'user' and ns.preamble %}{{- ns.preamble + '\\n\\n' }}"
    "{%- set ns.preamble = '' %}{%- endif %}"
    "{%- if message.role == 'tool' %}{{- '<tool_response>\\n' }}{%- endif %}"
    "{%- if message.content is string %}{{- message.content }}{%- endif %}"
    "{%- if message.role == 'tool' %}{{- '\\n</tool_response>' }}{%- endif %}"
    + _CALLS
    + "{{- '<end_of_turn>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)

BUILTIN = {"chatml": CHATML, "gemma": GEMMA}


def read_template(value: str) -> str:
    """`trainer.chat_template`'s template: a built-in name, or the text of a Jinja file."""
    if value in BUILTIN:
        return BUILTIN[value]
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(
            f"{value!r} is neither a built-in template ({', '.join(BUILTIN)}) nor a file"
        )
    return path.read_text()
