"""`tracerl export RUN_DIR OUT [--step N]`: a run's checkpoint as a Hugging Face directory
(safetensors, config, tokenizer with the run's chat template) that transformers and vLLM load.

A checkpoint holds the trained models and their optimizers' states in DCP shards
(`tracerl.train.checkpoint`); the export reads the actor's weights only (no optimizer state is
loaded), into the base model the run trained (`trainer.model` in the checkpoint's manifest), and
writes it with `export_hf`, the writer the engines' weight pushes use: a tied output layer is
named (vLLM's reload needs it), the write is atomic. The checkpoint is verified first (every
file's size and hash), whatever number of ranks saved it. The critic is not exported. A LoRA
run's checkpoint holds adapters only: they are put on the base and exported merged, or alone
(`--adapter`, peft's `adapter_config.json` and `adapter_model.safetensors`). A run's
snapshots (`loop.snapshot_every`) are such directories already, written as it trains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tracerl.config import ConfigError
from tracerl.config.train import TrainerConfig
from tracerl.train import checkpoint as ckpt

SNAPSHOTS = "snapshots"
"""`RUN_DIR/snapshots/step_N`: the actor's weights at step N as this module exports them
(`loop.snapshot_every`), written by the trainer's own export, atomically."""


def snapshot_path(run_dir: Path, step: int) -> Path:
    return run_dir / SNAPSHOTS / ckpt.checkpoint_name(step)


def list_snapshots(run_dir: Path) -> dict[int, Path]:
    """The run's snapshots by step, oldest first (a write in progress has another name, and
    a directory without its config is not complete: neither is listed)."""
    found = ckpt.list_checkpoints(run_dir / SNAPSHOTS, complete_when="config.json")
    return {int(p.name[len(ckpt.PREFIX) :]): p for p in found}


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    """The run's checkpoint of `step` (None: the newest); `ConfigError` naming what exists."""
    directory = run_dir / "checkpoints"
    found = ckpt.list_checkpoints(directory)
    if not found:
        raise ConfigError(f"RUN_DIR: {run_dir} has no checkpoints (expected {directory}/step_*)")
    if step is None:
        return found[-1]
    wanted = directory / ckpt.checkpoint_name(step)
    if wanted not in found:
        steps = ", ".join(str(int(p.name[len(ckpt.PREFIX) :])) for p in found)
        raise ConfigError(f"--step: {run_dir} has no checkpoint of step {step} (it has {steps})")
    return wanted


def export_checkpoint(
    run_dir: Path, out: Path, step: int | None = None, adapter: bool = False
) -> Path:
    """Write the actor of `run_dir`'s checkpoint `step` (None: the newest) to `out`; a LoRA
    run's merged (base + adapters), or with `adapter` its adapter alone in peft's layout."""
    from tracerl.train import lora

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"OUT: {out} exists and is not an empty directory")
    actor, tokenizer, config = checkpoint_actor(run_dir, step)
    if adapter and config.lora is None:
        raise ConfigError(f"--adapter: {run_dir} trained the full weights, not LoRA adapters")
    if config.lora is None:
        return ckpt.export_hf(out, actor, tokenizer)
    if adapter:
        lora.write_adapter(out, actor, config.model)
        return out
    merged = {"actor": dict(lora.merged_named_tensors(actor))}
    return ckpt.export_hf(out, actor, tokenizer, states=merged)


def checkpoint_actor(run_dir: Path, step: int | None = None) -> tuple[Any, Any, TrainerConfig]:
    """The actor of `run_dir`'s checkpoint `step` (None: the newest), verified and loaded in
    eval mode (a LoRA run's with its adapters), its tokenizer and the run's trainer config."""
    from tracerl.train import lora
    from tracerl.train.models import load_actor
    from tracerl.train.trainer import DTYPES

    root = find_checkpoint(run_dir, step)
    manifest = json.loads((root / ckpt.MANIFEST).read_text())
    try:
        ckpt.verify_checkpoint(root, manifest["config"])
    except ckpt.CheckpointError as e:
        raise ConfigError(f"RUN_DIR: {e}") from None
    config = TrainerConfig.model_validate(manifest["config"])
    actor, tokenizer, _ = load_actor(
        config.model, dtype=DTYPES[config.dtype], chat_template=config.chat_template
    )
    actor.eval()
    if config.lora is not None:
        lora.add_adapters(actor, config.lora)
    if manifest["format"] == 1:
        from safetensors.torch import load_model

        load_model(actor, str(root / "actor.safetensors"), strict=True)
    else:
        _load_actor_shards(root, actor)
    return actor, tokenizer, config


def _load_actor_shards(root: Path, actor: torch.nn.Module) -> None:
    """The actor's weights from a checkpoint's DCP shards, nothing else read."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    options = ckpt.state_options(actor)  # a LoRA actor: its adapters
    state = {"actor": get_model_state_dict(actor, options=options)}
    with ckpt.one_process_is_intended():
        try:
            dcp.load(state, checkpoint_id=str(root / "model"), no_dist=True)
        except CheckpointException as e:  # a BaseException: named as a CheckpointError
            raise ckpt.CheckpointError(f"{root}: {ckpt.dcp_failures(e)}") from e
    set_model_state_dict(actor, state["actor"], options=options)
