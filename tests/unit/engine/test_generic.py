"""The generic path runs a model whichever name its forward gives the cache: transformers called
it `past_key_values` before 5.2x and `cache` since (vLLM's CPU build pins transformers<5.20)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_outputs import ModelOutput

from tracerl.engine.generic import GenericRunner

NONE = torch.zeros(0, dtype=torch.long)


class OldNames(torch.nn.Module):
    """A model whose forward takes and returns `past_key_values`, as before the rename."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__()
        self.inner, self.config = model, model.config

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, **kw: Any) -> Any:
        out = self.inner(input_ids=input_ids, cache=past_key_values, **kw)
        return ModelOutput(logits=out.logits, past_key_values=out.cache)


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def test_either_cache_name_decodes_as_the_full_forward() -> None:
    model = tiny_llama()
    ids = torch.arange(10)
    full = model(torch.cat([ids, torch.tensor([7])])[None]).logits[0]
    for runner in (GenericRunner(model, 1), GenericRunner(OldNames(model), 1)):
        prefill = runner.forward(NONE, NONE, [(0, ids, 0)])
        decode = runner.forward(torch.tensor([7]), torch.tensor([10]), [])
        torch.testing.assert_close(prefill[0], full[9])
        torch.testing.assert_close(decode[0], full[10])  # the cache carried the prefix
