"""Random two-layer models of the families users bring, built from transformers configs with the
SmolLM2 tokenizer (the families' layouts, attention and caches; not their chat formats), saved
as Hugging Face directories any tracerl model setting takes. Small enough for the default suite:
hidden size 64, two layers, windows short enough that a test's sequences slide past them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracerl.models import build_random_model

WINDOW = 8
"""The sliding window of the windowed families: shorter than any test prompt."""

COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "initializer_range": 0.1,
    "tie_word_embeddings": False,
}

FAMILIES: dict[str, dict[str, Any]] = {
    # a Mistral that slides its attention window: the slot path cannot run it exactly
    "mistral-window": {"model_type": "mistral", "sliding_window": WINDOW},
    # sliding and global layers, soft-capped logits, scaled embeddings, a tied output layer
    "gemma2": {
        "model_type": "gemma2", "sliding_window": WINDOW, "tie_word_embeddings": True,
        "query_pre_attn_scalar": 16,
    },
    "gemma3": {
        "model_type": "gemma3_text", "sliding_window": WINDOW, "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 16,
    },
    "qwen3-moe": {
        "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "decoder_sparse_step": 1,
    },
    "qwen2-moe": {
        "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
        "decoder_sparse_step": 1,
    },
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "phi3": {"model_type": "phi3", "num_key_value_heads": 4},
    "olmo2": {"model_type": "olmo2"},
    "granite": {"model_type": "granite"},
}  # fmt: skip


def build_family(name: str, out: Path) -> Path:
    """Family `name` as a model directory at `out` (weights, config, the SmolLM2 tokenizer)."""
    settings = {**COMMON, **FAMILIES[name]}
    return build_random_model(out, settings.pop("model_type"), **settings)
