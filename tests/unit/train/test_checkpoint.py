import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_model
from torch.distributed.checkpoint.api import CheckpointException
from transformers import AutoModelForCausalLM

from tracerl.engine.weights import copy_weights, read_weights_dir
from tracerl.train.checkpoint import (
    CheckpointError,
    _digest,
    latest_checkpoint,
    list_checkpoints,
    training_state,
)
from tracerl.train.models import load_value_model
from tracerl.train.trainer import Trainer

from .conftest import make_samples

MakeTrainer = Callable[..., Trainer]
WATCHED = ("actor/lr", "critic/lr", "actor/policy_loss", "critic/value_loss", "actor/kl_loss")

RESUMABLE: dict[str, dict[str, Any]] = {
    "ppo": {
        "algorithm": "ppo",
        "actor": {"mini_batches": 2, "schedule": "linear", "lr_warmup_steps": 2},
        "critic": {"epochs": 2, "schedule": "cosine", "lr_warmup_steps": 1},
        "critic_warmup_steps": 1,
        "kl_reward_coef": 0.05,
        "total_steps": 6,
    },
    "grpo": {
        "algorithm": "grpo",
        "actor": {"epochs": 2, "schedule": "cosine", "lr_warmup_steps": 1},
        "kl_loss_coef": 0.05,
        "total_steps": 6,
    },
}


def watched(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics[k] for k in WATCHED if k in metrics}


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_resume_reproduces_an_uninterrupted_run(
    make_trainer: MakeTrainer, tmp_path: Path, algorithm: str
) -> None:
    overrides = RESUMABLE[algorithm]
    steps, stop = 5, 2
    batches = [make_samples(10 + s, count=4) for s in range(steps)]
    straight = make_trainer(**overrides)
    expected = [watched(straight.step(b)) for b in batches]
    assert len({m["actor/lr"] for m in expected if "actor/lr" in m}) > 2  # the rate moves

    first = make_trainer(**overrides)
    got = [watched(first.step(b)) for b in batches[:stop]]
    path = first.save_checkpoint(tmp_path / "checkpoints", loop_state={"data_position": stop})
    assert path.name == "step_00000002"
    resumed = make_trainer(**overrides)
    assert resumed.load_checkpoint(tmp_path / "checkpoints") == {"data_position": stop}
    assert resumed.step_count == stop
    got += [watched(resumed.step(b)) for b in batches[stop:]]
    assert got == expected  # the same floats, bit for bit
    for name, tensor in straight.actor.state_dict().items():
        assert torch.equal(tensor, resumed.actor.state_dict()[name]), name


def test_a_torn_or_corrupt_checkpoint_fails_before_loading_anything(
    make_trainer: MakeTrainer, tmp_path: Path
) -> None:
    saver = make_trainer(algorithm="ppo")
    saver.step(make_samples(0, count=4))
    root = tmp_path / "checkpoints"
    good = saver.save_checkpoint(root, loop_state=b"\x00opaque")
    fresh = make_trainer(algorithm="ppo")
    before = {k: v.clone() for k, v in fresh.actor.state_dict().items()}

    torn = root / "step_00000007"
    torn.mkdir()
    (torn / "actor.safetensors").write_bytes(b"half")  # a write that never got its manifest
    (root / ".tmp-step_00000008-x").mkdir()  # a crashed write's temp dir
    assert latest_checkpoint(root) == good
    with pytest.raises(CheckpointError, match="no manifest.json"):
        fresh.load_checkpoint(torn)

    shards = good / "model" / "__0_0.distcp"  # every model's and optimizer's tensors
    data = shards.read_bytes()
    shards.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model/__0_0.distcp does not match its manifest"):
        fresh.load_checkpoint(root)
    shards.unlink()
    with pytest.raises(CheckpointError, match="model/__0_0.distcp is missing"):
        fresh.load_checkpoint(good)
    assert fresh.step_count == 0
    for name, tensor in fresh.actor.state_dict().items():
        assert torch.equal(tensor, before[name]), name  # nothing was loaded
    with pytest.raises(CheckpointError, match="empty does not exist"):
        fresh.load_checkpoint(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty: holds no complete checkpoint"):
        fresh.load_checkpoint(tmp_path / "empty")


def test_a_checkpoint_from_another_config_is_refused(
    make_trainer: MakeTrainer, tmp_path: Path
) -> None:
    path = make_trainer(algorithm="grpo").save_checkpoint(tmp_path, loop_state=b"x")
    with pytest.raises(CheckpointError, match=r"actor.lr: 0.001 in the checkpoint, 0.002 now"):
        make_trainer(algorithm="grpo", actor={"lr": 2e-3}).load_checkpoint(path)
    with pytest.raises(CheckpointError, match="algorithm: 'grpo' in the checkpoint, 'rloo' now"):
        make_trainer(algorithm="rloo").load_checkpoint(path)
    # what does not change the numbers may differ
    assert make_trainer(algorithm="grpo", keep_last_n=5).load_checkpoint(path) == b"x"


def test_a_setting_added_since_a_checkpoint_and_left_unset_is_no_difference() -> None:
    from tracerl.train.checkpoint import config_differences

    saved = {"model": "tiny", "actor": {"lr": 0.001}}
    now = {"model": "tiny", "chat_template": None, "actor": {"lr": 0.001, "new": None}}
    assert config_differences(saved, now, frozenset()) == []
    now["chat_template"] = "chatml"  # set: it changes what the model is trained on
    assert config_differences(saved, now, frozenset()) == [
        "chat_template: '<absent>' in the checkpoint, 'chatml' now"
    ]


def test_only_the_last_n_checkpoints_are_kept(make_trainer: MakeTrainer, tmp_path: Path) -> None:
    trainer = make_trainer(algorithm="grpo", keep_last_n=2)
    samples = make_samples(0, count=4)
    for _ in range(3):
        trainer.step(samples)
        trainer.save_checkpoint(tmp_path)
    trainer.save_checkpoint(tmp_path, loop_state=b"again")  # the same step saved twice
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000003"]
    assert make_trainer(algorithm="grpo").load_checkpoint(tmp_path) == b"again"


def test_a_full_disk_is_named_and_the_checkpoints_before_stay(
    make_trainer: MakeTrainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch reports a write into a full disk as `unexpected pos N vs M` (what a 2 MiB tmpfs
    gives): the error names the disk, and the checkpoint before it still resumes."""
    import shutil

    import torch.distributed.checkpoint as dcp

    from tracerl.train import checkpoint

    trainer = make_trainer(algorithm="grpo")
    trainer.step(make_samples(0, count=4))
    trainer.save_checkpoint(tmp_path, loop_state=b"first")

    def full(*args: Any, **kwargs: Any) -> None:
        # as DCP raises it: a BaseException holding each rank's error
        error = RuntimeError(
            "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
        )
        raise CheckpointException("CheckpointException ranks:dict_keys([0])", {0: (error, None)})

    monkeypatch.setattr(dcp, "save", full)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda _: usage._replace(free=4096))
    trainer.step(make_samples(1, count=4))
    with pytest.raises(CheckpointError, match=r"step_00000002 under .* its disk has 0 MiB free"):
        trainer.save_checkpoint(tmp_path, loop_state=b"second")
    # with room on the disk: torch's error, as a CheckpointError (an Exception) all the same
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda _: usage._replace(free=2**50))
    with pytest.raises(CheckpointError, match=r"failed: rank 0: RuntimeError: .*unexpected pos"):
        trainer.save_checkpoint(tmp_path, loop_state=b"second")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001"]  # no temporary left
    assert make_trainer(algorithm="grpo").load_checkpoint(tmp_path) == b"first"


def test_export_is_a_model_directory_engines_load(
    make_trainer: MakeTrainer, tmp_path: Path, tiny: tuple[Any, Any]
) -> None:
    trainer = make_trainer(algorithm="ppo")
    trainer.step(make_samples(0, count=4))
    out = trainer.export(tmp_path / "export")
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in trainer.actor.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    critic = load_value_model(str(out / "critic"), require_head=True)
    assert trainer.critic is not None
    for name, tensor in trainer.critic.state_dict().items():
        assert torch.equal(critic.state_dict()[name], tensor), name
    # the engine's loaders: from disk, and in process
    engine_model = copy.deepcopy(tiny[0])
    copy_weights(engine_model, read_weights_dir(out))
    pushed = copy.deepcopy(tiny[0])
    copy_weights(pushed, dict(trainer.actor_named_tensors()))
    for name, tensor in trainer.actor.state_dict().items():
        assert torch.equal(engine_model.state_dict()[name], tensor), name
        assert torch.equal(pushed.state_dict()[name], tensor), name
    trainer.export(out)  # replacing an export in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_checkpoint_of_the_previous_format_still_resumes(
    make_trainer: MakeTrainer, tmp_path: Path
) -> None:
    """Format 1 (before sharded trainers): weights in safetensors, optimizers in state.pt."""
    trainer = make_trainer(algorithm="ppo")
    trainer.step(make_samples(0, count=4))
    old = tmp_path / "step_00000001"
    old.mkdir()
    for name, model in (("actor", trainer.actor), ("critic", trainer.critic)):
        assert model is not None
        save_model(model, str(old / f"{name}.safetensors"))
    state = training_state(trainer.step_count, trainer.actor_scheduler, trainer.critic_scheduler)
    state["actor_optimizer"] = trainer.actor_optimizer.state_dict()
    assert trainer.critic_optimizer is not None
    state["critic_optimizer"] = trainer.critic_optimizer.state_dict()
    torch.save(state, old / "state.pt")
    files = {
        f.name: {"bytes": f.stat().st_size, "sha256": _digest(f)} for f in sorted(old.iterdir())
    }
    manifest = {
        "format": 1, "step": 1, "config": trainer.config.model_dump(mode="json"),
        "loop_state": None, "files": files,
    }  # fmt: skip
    (old / "manifest.json").write_text(json.dumps(manifest))

    resumed = make_trainer(algorithm="ppo")
    assert resumed.load_checkpoint(tmp_path) is None and resumed.step_count == 1
    batch = make_samples(1, count=4)
    assert watched(resumed.step(batch)) == watched(trainer.step(batch))


@pytest.mark.parametrize("shard", [False, True], ids=["one-file", "sharded"])
def test_an_export_of_a_tied_model_names_its_output_layer(
    tiny: tuple[Any, Any], tmp_path: Path, shard: bool
) -> None:
    """A tied output layer is written under its own name too (vLLM's layerwise reload left it
    at its initial weights when the checkpoint gave it none), listed in a sharded export's
    index; transformers and the embedded engine load the export as the model it is."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tracerl.train.checkpoint import TIED_HEAD_FILE, export_hf

    config = LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if shard:  # save_pretrained splits at this size and writes an index
        model.save_pretrained = _sharded(model.save_pretrained)  # type: ignore[method-assign]
    out = export_hf(tmp_path / "tied", model, tiny[1])
    head = read_weights_dir(out)["lm_head.weight"]
    assert torch.equal(head, model.get_input_embeddings().weight)
    index = out / "model.safetensors.index.json"
    assert index.exists() == shard
    if shard:
        assert json.loads(index.read_text())["weight_map"]["lm_head.weight"] == TIED_HEAD_FILE
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    engine_model = LlamaForCausalLM(config)
    copy_weights(engine_model, read_weights_dir(out))
    assert torch.equal(engine_model.lm_head.weight, model.lm_head.weight)
    # an untied model's export is unchanged
    untied = export_hf(tmp_path / "untied", copy.deepcopy(tiny[0]), tiny[1])
    assert not (untied / TIED_HEAD_FILE).exists()


def _sharded(save: Callable[..., Any]) -> Callable[..., Any]:
    def save_in_shards(*args: Any, **kwargs: Any) -> Any:
        return save(*args, max_shard_size="20KB", **kwargs)

    return save_in_shards
