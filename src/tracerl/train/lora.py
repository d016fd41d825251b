"""LoRA (`[trainer.lora]`): low-rank adapters trained in place of the full weights.

peft's LoRA layers are injected into the model itself (`inject_adapter_in_model`), so the actor
stays the Hugging Face class that the trainer's forwards, the probe and the export know; only
an adapted layer's own parameters move under it (`q_proj.weight` becomes
`q_proj.base_layer.weight`, beside `q_proj.lora_A.default.weight` and `lora_B`).

- The base is frozen; the optimizer holds the adapters (and a LoRA critic's value head).
- The reference policy of a KL term is the actor with its adapters off (`adapters_disabled`),
  not a second copy of the model.
- A LoRA critic shares the actor's frozen base tensors (`share_frozen_base`) and trains
  adapters of its own.
- Checkpoints hold the trainable tensors only; the base comes back from `trainer.model`, which
  the checkpoint's config names.
- Engines get the merged weights (`merged_named_tensors`: base + (alpha / rank) * B @ A,
  computed out of place, so the base stays bit-identical) under the base model's own names, or
  the adapter alone in peft's file layout (`write_adapter`), which peft and vLLM load.

Written here rather than taken from peft's `PeftModel` wrapper: the wrapper renames every
parameter and owns saving; the trainer needs the model's own names for everything but the
adapters, merges without touching the base, and switches the adapters off for one pass.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tracerl.config.train import ALL_LINEAR, LoraConfig
from tracerl.engine.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    PEFT_PREFIX,
    AdapterWeights,
    tuner_layers,
)

ADAPTER = "default"  # peft's adapter name inside the model; never written to a file


class LoraError(ValueError):
    """A LoRA setting the model cannot take."""


def _peft_config(settings: LoraConfig) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=settings.rank,
        lora_alpha=settings.scale_alpha,
        lora_dropout=settings.dropout,
        target_modules=(
            ALL_LINEAR if settings.target_modules == [ALL_LINEAR] else settings.target_modules
        ),
        bias="none",
    )


def add_adapters(model: nn.Module, settings: LoraConfig) -> None:
    """Freeze `model` and inject trainable adapters into the layers `settings` names (A drawn
    from torch's global generator, B zero: the adapted model starts as the base). The new
    modules take the model's mode: in eval mode their dropout stays off."""
    from peft import inject_adapter_in_model

    model.requires_grad_(False)
    training = model.training
    try:
        inject_adapter_in_model(_peft_config(settings), model, adapter_name=ADAPTER)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise LoraError(f"trainer.lora.target_modules: {e}") from None
    model.train(training)
    for name, layer in tuner_layers(model).items():
        if isinstance(layer.get_base_layer(), nn.Embedding):
            raise LoraError(
                f"trainer.lora.target_modules: {name} is an embedding; adapters on "
                "embeddings are not supported (the output layer may be tied to it)"
            )
    for name, param in model.named_parameters():
        if param.requires_grad != _is_adapter(name):
            raise LoraError(f"{name}: trainable={param.requires_grad} after adding adapters")


def adapt(actor: nn.Module, critic: Any, settings: LoraConfig, world_size: int) -> None:
    """The trainer's models for LoRA: adapters on the actor; on a `critic = "lora"` critic
    too, over the actor's own frozen base tensors, with its value head trained whole."""
    if world_size > 1:
        raise LoraError(
            "trainer.lora: LoRA on several trainer ranks (FSDP2) is not supported yet; use one"
        )
    if critic is not None and settings.critic == "lora":
        share_frozen_base(critic, actor)
        add_adapters(critic.backbone, settings)
        critic.value_head.requires_grad_(True)
    add_adapters(actor, settings)


def _is_adapter(name: str) -> bool:
    return f".{ADAPTER}." in name and ".lora_" in name


def share_frozen_base(critic: nn.Module, actor: nn.Module) -> int:
    """Point `critic`'s parameters at `actor`'s tensors of the same name (the backbone both
    derive from), before either has adapters: both are frozen, so one copy serves both.
    Returns how many were shared."""
    own = dict(actor.named_parameters())
    shared = 0
    for name, param in critic.named_parameters():
        source = own.get(name)
        if source is not None and source.shape == param.shape and source.dtype == param.dtype:
            param.data = source.data
            shared += 1
    return shared


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model's forward: every adapter switched off, and back on after."""
    layers = list(tuner_layers(model).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


@contextlib.contextmanager
def dropout_active(model: nn.Module) -> Iterator[None]:
    """The adapters' dropout in train mode (the models otherwise run in eval mode)."""
    dropouts = [d for layer in tuner_layers(model).values() for d in layer.lora_dropout.values()]
    for d in dropouts:
        d.train()
    try:
        yield
    finally:
        for d in dropouts:
            d.eval()


@torch.no_grad()
def merged_named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """`model`'s parameters under the names the model has without adapters: an adapted
    layer's weight merged out of place (base + its delta), every other tensor as it is (not
    copied); the adapters' own tensors are left out. Tied aliases are listed under each name,
    as `named_parameters(remove_duplicate=False)` lists them."""
    layers = tuner_layers(model)
    out: list[tuple[str, torch.Tensor]] = []
    for name, param in model.named_parameters(remove_duplicate=False):
        owner, _, rest = name.rpartition(".base_layer.")
        if owner and owner in layers:
            tensor = param.detach()
            if rest == "weight":
                delta = layers[owner].get_delta_weight(ADAPTER)
                tensor = tensor + delta.to(tensor.dtype)
            out.append((f"{owner}.{rest}", tensor))
        elif not _is_adapter(name):
            out.append((name, param.detach()))
    return out


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters alone, under the keys of peft's files
    (`base_model.model.<layer>.lora_A.weight`)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    return {PEFT_PREFIX + k: v.detach().contiguous().cpu() for k, v in state.items()}


def write_adapter(path: Path, model: nn.Module, base_model: str) -> None:
    """peft's adapter directory (`adapter_config.json`, `adapter_model.safetensors`) for the
    base `base_model`: what `PeftModel.from_pretrained(base, path)` and vLLM's LoRA loader read."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    peft_config: Any = model.peft_config
    config = peft_config[ADAPTER]
    data = config.to_dict()
    data["base_model_name_or_path"] = base_model
    data["target_modules"] = sorted(data["target_modules"])  # a set: not JSON
    (path / ADAPTER_CONFIG).write_text(json.dumps(data, indent=1, default=str))
    save_file(adapter_state(model), str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def write_adapter_atomically(path: Path, model: nn.Module, base_model: str) -> Path:
    """`write_adapter` into a fresh directory renamed over `path`: a server loading `path`
    never reads a half-written adapter."""
    from tracerl.train.checkpoint import replaced_atomically

    with replaced_atomically(path) as tmp:
        write_adapter(tmp, model, base_model)
    return path


ENGINE_ADAPTER = "policy"  # the name a run's adapter has in its engines


def adapter_weights(model: nn.Module) -> AdapterWeights:
    """The adapter push for the engines (`tracerl.engine.adapters`): rank, alpha and the
    adapters' tensors."""
    config: Any = model.peft_config
    settings = config[ADAPTER]
    return AdapterWeights(
        ENGINE_ADAPTER,
        {"r": settings.r, "lora_alpha": settings.lora_alpha, "use_rslora": settings.use_rslora},
        adapter_state(model),
    )
