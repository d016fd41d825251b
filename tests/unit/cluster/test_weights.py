"""Weights packaged for the object store (no Ray needed): a package is the export's files, a
later one the same files with the weights serialized from the trainer's tensors in memory, and
a package unpacks to a directory the engine loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tracerl.cluster.weights import (
    Package,
    Packer,
    WeightsChannel,
    as_tensor,
    pack,
    unpack,
    write_safetensors,
)
from tracerl.config.train import TrainerConfig
from tracerl.engine.weights import read_weights_dir
from tracerl.train.trainer import Trainer


def test_later_packages_carry_the_trained_weights_under_the_exports_names(tmp_path: Path) -> None:
    trainer = Trainer(TrainerConfig(model="tiny"))
    packer = Packer()
    first = packer.package(trainer, rank=0)
    assert first is not None and packer.names  # one file of named parameters: reusable
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= first.files.keys()
    assert not any(name.startswith("critic/") for name in first.files)
    with torch.no_grad():  # as a step would
        for p in trainer.actor.parameters():
            p.add_(0.5)
    second = packer.package(trainer, rank=0)
    assert second is not None and second.tensors.keys() == set(packer.names)
    assert second.files.keys() == first.files.keys() - {"model.safetensors"}
    assert second.files["config.json"] == first.files["config.json"]
    loaded = read_weights_dir(unpack(second, tmp_path / "v2"))
    exported = read_weights_dir(trainer.export(tmp_path / "export"))
    assert loaded.keys() == exported.keys()
    for name, tensor in exported.items():
        assert torch.equal(loaded[name], tensor), name
    assert not torch.equal(read_weights_dir(unpack(first, tmp_path / "v1"))[name], tensor)
    assert packer.package(trainer, rank=1) is None  # only rank 0 sends


def test_unpack_replaces_the_directory_and_refuses_paths_out_of_it(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "model.safetensors").write_bytes(b"w1")
    (tmp_path / "export" / "critic").mkdir()
    (tmp_path / "export" / "critic" / "model.safetensors").write_bytes(b"c")
    files = pack(tmp_path / "export")
    assert files == {"model.safetensors": b"w1"}
    target = unpack(Package(files), tmp_path / "node" / "weights")
    unpack(Package({"model.safetensors": b"w2", "config.json": b"{}"}), target)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert (target / "model.safetensors").read_bytes() == b"w2"
    with pytest.raises(ValueError, match="'../evil' leaves its directory"):
        unpack(Package({"../evil": b"x"}), target)
    assert (target / "model.safetensors").read_bytes() == b"w2"  # untouched
    with pytest.raises(ValueError, match="no .safetensors weights"):
        pack(tmp_path / "node" / "nothing-here")


def test_the_channel_resolves_only_the_newest_package() -> None:
    channel = WeightsChannel()
    assert channel.resolve("/shared/weights") == "/shared/weights"
    name = channel.publish(3, "ref-3")
    assert name == "object-store:v3" and channel.resolve(name) == "ref-3"
    channel.publish(4, "ref-4")
    with pytest.raises(ValueError, match="object-store:v3 are gone"):
        channel.resolve(name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_tensors_written_from_their_bytes_read_back_equal(tmp_path: Path, dtype) -> None:
    from safetensors.torch import load_file

    tensors = {
        "a.weight": (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 7).to(dtype),
        "b": torch.tensor(3.5).to(dtype),  # 0-dim
        "c": torch.zeros(0, 5, dtype=dtype),  # empty
        "d.t": torch.arange(6, dtype=torch.float32).reshape(2, 3).t().to(dtype),  # strided
    }
    write_safetensors(tmp_path / "w.safetensors", {n: as_tensor(t) for n, t in tensors.items()})
    loaded = load_file(str(tmp_path / "w.safetensors"))
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == dtype and torch.equal(loaded[name], tensor), name


def test_a_tied_models_packages_carry_its_output_layer(tmp_path: Path, tiny) -> None:
    """A tied output layer, which the export writes under its own name in a file of its own
    (vLLM needs it named), stays in the fast path: later packages carry it in their one
    weights file, and no stale copy of the first export's rides along."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tracerl.train.checkpoint import TIED_HEAD_FILE

    _, tokenizer = tiny
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tied")
    tokenizer.save_pretrained(tmp_path / "tied")
    trainer = Trainer(TrainerConfig(model=str(tmp_path / "tied")))
    packer = Packer()
    first = packer.package(trainer, rank=0)
    assert first is not None and TIED_HEAD_FILE in first.files
    assert packer.names is not None and "lm_head.weight" in packer.names
    with torch.no_grad():
        trainer.actor.get_input_embeddings().weight.add_(0.5)
    second = packer.package(trainer, rank=0)
    assert second is not None and TIED_HEAD_FILE not in second.files
    loaded = read_weights_dir(unpack(second, tmp_path / "v2"))
    assert torch.equal(loaded["lm_head.weight"], trainer.actor.get_input_embeddings().weight)
    assert torch.equal(loaded["lm_head.weight"], loaded["model.embed_tokens.weight"])
