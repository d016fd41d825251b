from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file, save_model

from tracerl.models import resolve_model
from tracerl.train.models import (
    VALUE_HEAD_KEY,
    CheckpointKeyError,
    init_value_head,
    load_actor,
    load_value_model,
    value_model_from_actor,
)


def test_a_critic_from_an_actor_checkpoint_has_exactly_its_backbone() -> None:
    actor, _, _ = load_actor("tiny")
    critic = load_value_model("tiny")
    actor_state, critic_state = actor.state_dict(), critic.state_dict()
    # every backbone key is the actor's key; the vocabulary head became value_head.weight
    assert set(critic_state) == (set(actor_state) - {"lm_head.weight"}) | {VALUE_HEAD_KEY}
    for key, tensor in critic_state.items():
        if key != VALUE_HEAD_KEY:
            assert torch.equal(tensor, actor_state[key]), key
    assert critic_state[VALUE_HEAD_KEY].shape == (1, actor.config.hidden_size)
    assert critic.config.tie_word_embeddings is False
    assert actor.config.tie_word_embeddings is False  # the actor's config is not touched
    # the in-memory path gives the same critic, head included (same seed)
    same = value_model_from_actor(actor)
    for key, tensor in same.state_dict().items():
        assert torch.equal(tensor, critic_state[key]), key


def test_value_head_init_statistics() -> None:
    head = torch.nn.Linear(4096, 1, bias=False)
    init_value_head(head, torch.Generator().manual_seed(0))
    w = head.weight.detach().flatten()
    std = 1 / 4097  # Normal(0, 1 / (hidden + 1))
    # 4096 draws: the sample std is within ~1.1 % (1 / sqrt(2n)) of std, the mean within
    # std / 64; 5 % and 4 / 64 are several standard errors.
    assert abs(float(w.std()) / std - 1) < 0.05
    assert abs(float(w.mean())) < 4 * std / 64
    # in place on a trainable leaf, without recording an autograd op
    assert head.weight.requires_grad and head.weight.is_leaf and head.weight.grad_fn is None
    # far below nn.Linear's default (kaiming uniform, std 1 / sqrt(3 * 4096))
    assert float(w.std()) < 0.1 / (3 * 4096) ** 0.5
    critic = load_value_model("tiny", seed=3)
    assert critic.value_head.weight.requires_grad
    tiny_std = float(critic.value_head.weight.detach().std())
    assert 0.5 / 65 < tiny_std < 1.5 / 65  # 64 draws of std 1/65


def _critic_dir(tmp_path: Path) -> Path:
    critic = load_value_model("tiny", seed=1)
    out = tmp_path / "critic"
    out.mkdir()
    critic.config.save_pretrained(out)
    save_model(critic, str(out / "model.safetensors"))
    return out


def test_a_critic_checkpoint_loads_with_an_exact_key_match(tmp_path: Path) -> None:
    out = _critic_dir(tmp_path)
    loaded = load_value_model(str(out), require_head=True, seed=99)
    saved = load_file(out / "model.safetensors")
    for key, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, saved[key]), key  # the saved head, not a fresh one
    # an actor checkpoint is not a critic checkpoint
    with pytest.raises(CheckpointKeyError, match=r"missing \['value_head.weight'\].*lm_head"):
        load_value_model("tiny", require_head=True)
    # a critic checkpoint that lost its head
    saved.pop(VALUE_HEAD_KEY)
    save_file(saved, out / "model.safetensors")
    with pytest.raises(CheckpointKeyError, match=r"missing \['value_head.weight'\]"):
        load_value_model(str(out), require_head=True)


def test_foreign_backbone_weights_are_refused(tmp_path: Path) -> None:
    tensors = load_file(resolve_model("tiny") / "model.safetensors")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "config.json").write_text((resolve_model("tiny") / "config.json").read_text())
    save_file(
        {**tensors, "model.layers.7.mlp.up_proj.weight": torch.zeros(1)}, extra / "w.safetensors"
    )
    with pytest.raises(CheckpointKeyError, match=r"unexpected \['model.layers.7"):
        load_value_model(str(extra))
    tensors.pop("model.norm.weight")
    save_file(tensors, extra / "w.safetensors")
    with pytest.raises(CheckpointKeyError, match=r"missing \['model.norm.weight'\]"):
        load_value_model(str(extra))
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, extra / "w.safetensors")
    with pytest.raises(CheckpointKeyError, match=r"model.norm.weight: shape \(3,\)"):
        load_value_model(str(extra))
