"""LoRA in the trainer (`[trainer.lora]`, `tracerl.train.lora`): only adapters train, the merged
weights the engines get are the adapted model, the reference is the base, checkpoints hold the
adapters and resume exactly, exports load in transformers and peft."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from tracerl.train import lora
from tracerl.train.trainer import Trainer

from .conftest import make_samples

MakeTrainer = Callable[..., Trainer]
LORA = {"rank": 4}
DROPOUT = 0.1
INPUT = torch.tensor([[5, 17, 230, 1204, 99, 3005, 41, 8]])


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT).logits


def base_model() -> Any:
    from tracerl.models import resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    return model.eval()


def trained(make_trainer: MakeTrainer, steps: int = 2, **overrides: Any) -> Trainer:
    trainer = make_trainer(algorithm="grpo", lora=LORA, **overrides)
    for s in range(steps):
        trainer.step(make_samples(s, count=4))
    return trainer


def test_only_the_adapters_train_and_the_base_stays_bit_identical(
    make_trainer: MakeTrainer,
) -> None:
    trainer = make_trainer(algorithm="grpo", lora=LORA)
    before = {n: p.detach().clone() for n, p in trainer.actor.named_parameters()}
    optimized = {id(p) for g in trainer.actor_optimizer.param_groups for p in g["params"]}
    adapters = {id(p) for n, p in trainer.actor.named_parameters() if ".lora_" in n}
    assert optimized == adapters and adapters
    for s in range(2):
        trainer.step(make_samples(s, count=4))
    changed = {n for n, p in trainer.actor.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n for n in changed)
    assert any(".lora_B." in n for n in changed)  # B starts at zero: the adapters now act


def test_the_merged_weights_are_the_adapted_model(make_trainer: MakeTrainer) -> None:
    trainer = trained(make_trainer)
    merged = dict(trainer.actor_named_tensors())
    plain = base_model()
    assert set(merged) == {n for n, _ in plain.named_parameters(remove_duplicate=False)}
    plain.load_state_dict(merged, strict=True)
    adapted = logits(trainer.actor)
    assert not torch.allclose(adapted, logits(base_model()))  # training moved it
    torch.testing.assert_close(logits(plain), adapted)


def test_an_export_loads_as_the_merged_model_and_the_adapter_loads_in_peft(
    make_trainer: MakeTrainer, tmp_path: Path
) -> None:
    from peft import PeftModel

    trainer = trained(make_trainer)
    adapted = logits(trainer.actor)
    exported = AutoModelForCausalLM.from_pretrained(trainer.export(tmp_path / "export")).eval()
    torch.testing.assert_close(logits(exported), adapted)
    lora.write_adapter(tmp_path / "adapter", trainer.actor, "tiny")
    files = sorted(p.name for p in (tmp_path / "adapter").iterdir())
    assert files == [lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS]
    with_adapter = PeftModel.from_pretrained(base_model(), tmp_path / "adapter").eval()
    torch.testing.assert_close(logits(with_adapter), adapted)


def test_a_lora_critic_exports_merged_with_its_head(
    make_trainer: MakeTrainer, tmp_path: Path
) -> None:
    from tracerl.train.models import load_value_model

    trainer = make_trainer(algorithm="ppo", lora=LORA)
    for s in range(2):
        trainer.step(make_samples(s, count=4))
    assert trainer.critic is not None
    out = trainer.export(tmp_path / "export")
    critic = load_value_model(str(out / "critic"), require_head=True).eval()
    keep = torch.ones_like(INPUT, dtype=torch.bool)
    with torch.no_grad():
        expected = trainer.critic(INPUT, keep=keep)
        assert not torch.allclose(expected, _base_critic(trainer)(INPUT, keep=keep))
        torch.testing.assert_close(critic(INPUT, keep=keep), expected)


def _base_critic(trainer: Trainer) -> Any:
    """The trainer's critic with its adapters off: what an export without them would hold."""
    import copy

    critic = copy.deepcopy(trainer.critic)
    assert critic is not None
    for layer in lora.tuner_layers(critic).values():
        layer.enable_adapters(False)
    return critic


def test_the_reference_is_the_actor_without_its_adapters(make_trainer: MakeTrainer) -> None:
    trainer = trained(make_trainer, kl_loss_coef=0.1)
    assert trainer.reference is None  # no second copy of the model
    with lora.adapters_disabled(trainer.actor):
        assert torch.equal(logits(trainer.actor), logits(base_model()))
    assert any(p.requires_grad for n, p in trainer.actor.named_parameters() if ".lora_" in n)
    metrics = trainer.step(make_samples(7, count=4))
    assert metrics["actor/kl_loss"] > 0  # the adapted actor has moved away from the base


def test_a_lora_critic_shares_the_actors_frozen_base(make_trainer: MakeTrainer) -> None:
    trainer = make_trainer(algorithm="ppo", lora=LORA)
    assert trainer.critic is not None
    actor = {n: p for n, p in trainer.actor.named_parameters()}
    shared = [
        n
        for n, p in trainer.critic.named_parameters()
        if not p.requires_grad
        and n.replace(".base_layer.", ".") in {k.replace(".base_layer.", ".") for k in actor}
    ]
    for name in shared:
        twin = actor.get(name, actor.get(name.replace(".base_layer.", ".")))
        assert twin is not None and twin.data_ptr() == trainer.critic.get_parameter(name).data_ptr()
    trainable = {n for n, p in trainer.critic.named_parameters() if p.requires_grad}
    assert "value_head.weight" in trainable
    assert all(".lora_" in n for n in trainable - {"value_head.weight"})
    full = make_trainer(algorithm="ppo", lora={**LORA, "critic": "full"})
    assert full.critic is not None
    assert all(p.requires_grad for p in full.critic.parameters())


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_resume_with_lora_reproduces_an_uninterrupted_run(
    make_trainer: MakeTrainer, tmp_path: Path, algorithm: str
) -> None:
    overrides: dict[str, Any] = {
        "algorithm": algorithm,
        "lora": {**LORA, "dropout": DROPOUT},
        "total_steps": 6,
        "actor": {"epochs": 2, "schedule": "cosine", "lr_warmup_steps": 1},
    }
    overrides["kl_reward_coef" if algorithm == "ppo" else "kl_loss_coef"] = 0.05
    steps, stop = 4, 2
    batches = [make_samples(10 + s, count=4) for s in range(steps)]
    straight = make_trainer(**overrides)
    expected = [straight.step(b) for b in batches]

    first = make_trainer(**overrides)
    got = [first.step(b) for b in batches[:stop]]
    path = first.save_checkpoint(tmp_path / "checkpoints")
    saved = _saved_keys(path)
    assert saved and all(".lora_" in k or "value_head" in k for k in saved)
    resumed = make_trainer(**overrides)
    resumed.load_checkpoint(tmp_path / "checkpoints")
    got += [resumed.step(b) for b in batches[stop:]]
    keys = ("actor/policy_loss", "actor/lr", "critic/value_loss", "actor/kl_loss", "kl/ref_mean")
    assert [{k: m[k] for k in keys if k in m} for m in got] == [
        {k: m[k] for k in keys if k in m} for m in expected
    ]
    for name, tensor in straight.actor.state_dict().items():
        assert torch.equal(tensor, resumed.actor.state_dict()[name]), name


def _saved_keys(checkpoint: Path) -> list[str]:
    """The model tensors a checkpoint holds (optimizer state left out)."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(checkpoint / "model")).read_metadata()
    return [
        k.split(".", 1)[1]
        for k in metadata.state_dict_metadata
        if k.split(".", 1)[0] in ("actor", "critic")
    ]


def test_dropout_acts_in_the_update_only(make_trainer: MakeTrainer) -> None:
    trainer = make_trainer(algorithm="grpo", lora={**LORA, "dropout": 0.5})
    assert not any(m.training for m in trainer.actor.modules())  # the adapters' dropout too
    trainer.step(make_samples(0, count=4))  # B moves away from zero
    first, second = logits(trainer.actor), logits(trainer.actor)
    assert torch.equal(first, second)  # eval mode outside the update
    with lora.dropout_active(trainer.actor):
        assert not torch.equal(logits(trainer.actor), first)


def test_adapters_on_a_missing_or_embedding_layer_are_refused(make_trainer: MakeTrainer) -> None:
    with pytest.raises(lora.LoraError, match="trainer.lora.target_modules"):
        make_trainer(algorithm="grpo", lora={"target_modules": ["no_such_proj"]})
    with pytest.raises(ValueError, match="'all-linear' stands alone"):
        make_trainer(algorithm="grpo", lora={"target_modules": ["all-linear", "q_proj"]})
    with pytest.raises(lora.LoraError, match="embed_tokens is an embedding"):
        make_trainer(algorithm="grpo", lora={"target_modules": ["embed_tokens", "q_proj"]})


def test_tracerl_export_writes_a_lora_runs_merged_model_or_its_adapter(
    make_trainer: MakeTrainer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from peft import PeftModel

    from tracerl.cli.main import main

    trainer = make_trainer(algorithm="ppo", lora=LORA)  # a LoRA critic in the checkpoint too
    for s in range(2):
        trainer.step(make_samples(s, count=4))
    trainer.save_checkpoint(tmp_path / "run" / "checkpoints")
    adapted = logits(trainer.actor)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    torch.testing.assert_close(logits(merged), adapted)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "adapter"), "--adapter"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "merged"), str(tmp_path / "adapter")]
    with_adapter = PeftModel.from_pretrained(base_model(), tmp_path / "adapter").eval()
    torch.testing.assert_close(logits(with_adapter), adapted)

    full = make_trainer(algorithm="grpo")
    full.step(make_samples(0, count=4))
    full.save_checkpoint(tmp_path / "full" / "checkpoints")
    assert main(["export", str(tmp_path / "full"), str(tmp_path / "x"), "--adapter"]) == 2
    assert "--adapter: " in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
