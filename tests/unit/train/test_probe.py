"""The trainer's side of the weight probe (`tracerl.train.probe`): the log-probs it compares,
and the diagnosis that names the layer an engine kept at its initial weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tracerl.train.probe import layer_groups, sequence_logprobs, suspects, tied_names


def small_llama(tied: bool) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied,
        initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


TOKENS = [5, 17, 250, 3, 99, 42, 7, 180, 64, 12]
PROMPT = 4


def test_log_probs_are_log_softmax_at_the_temperature_of_each_next_token() -> None:
    model = small_llama(tied=False)
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0].float() / 0.7
    expected = torch.log_softmax(logits, -1)[PROMPT - 1 : -1].gather(
        -1, torch.tensor(TOKENS[PROMPT:])[:, None]
    )[:, 0]
    got = sequence_logprobs(model, TOKENS, PROMPT, 0.7)
    assert len(got) == len(TOKENS) - PROMPT
    assert torch.allclose(torch.tensor(got), expected, atol=1e-6)


def test_layers_are_the_decoder_blocks_and_the_modules_around_them() -> None:
    tied = small_llama(tied=True)
    groups = layer_groups(tied)
    assert list(groups) == [
        "model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2",
        "model.norm", "lm_head",
    ]  # fmt: skip
    assert groups["lm_head"] == ["lm_head.weight"]
    assert tied_names(tied) == {"lm_head.weight": "model.embed_tokens.weight"}
    assert tied_names(small_llama(tied=False)) == {}


@pytest.mark.parametrize(
    ("tied", "stale", "named"),
    [
        (True, "lm_head", "lm_head (tied to model.embed_tokens)"),
        (False, "lm_head", "lm_head"),
        (False, "model.layers.1", "model.layers.1"),
    ],
)
def test_the_layer_an_engine_kept_at_its_initial_weights_is_named(
    tmp_path: Path, tied: bool, stale: str, named: str
) -> None:
    """A trained model (every weight moved) against an engine running it with one layer still
    at the initial weights: that layer, and no other, is a suspect. For a tied output layer,
    the engine has the trained embedding and the initial head (vLLM's stale-head defect)."""
    model = small_llama(tied)
    model.save_pretrained(tmp_path / "initial")  # a tied model's files hold no lm_head.weight
    initial = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    with torch.no_grad():
        for p in model.parameters():  # one "update": every layer changes
            p.add_(0.05 * torch.randn_like(p))
    kept = {n: initial[n] for n in layer_groups(model)[stale]}
    engine = sequence_logprobs(model, TOKENS, PROMPT, 1.0, kept)
    trained = sequence_logprobs(model, TOKENS, PROMPT, 1.0)
    assert max(abs(a - b) for a, b in zip(engine, trained, strict=True)) > 1e-2
    assert suspects(model, TOKENS, PROMPT, 1.0, engine, tmp_path / "initial") == [named]
    # an engine whose difference no single layer explains: no suspect is made up
    noise = [lp + 0.3 * (-1) ** i for i, lp in enumerate(trained)]
    assert suspects(model, TOKENS, PROMPT, 1.0, noise, tmp_path / "initial") == []
