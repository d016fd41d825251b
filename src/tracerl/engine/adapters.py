"""LoRA adapters in the embedded engine: a push of the adapters alone, applied in the forward.

The engine's model keeps its base weights; an adapter (peft's config and its tensors under the
keys of peft's files, `base_model.model.<layer>.lora_A.weight`) is injected as peft LoRA layers
on its first load and copied into place on every later one, so a training step's sync moves the
adapters' bytes only (a few MB) and the base is never rewritten. The layers compute
`base(x) + (alpha / rank) * B(A(x))` in the forward; nothing is merged.

A load is validated whole (every tensor of the adapter present, names, shapes, finite values)
before anything is written, like a full weight load (`tracerl.engine.weights`), so a bad push
leaves the engine serving its previous adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tracerl.engine.types import WeightLoadError

PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class AdapterWeights:
    """One adapter push: its name in the engine, peft's config fields (`r`, `lora_alpha`,
    `use_rslora`) and its tensors under peft's file keys."""

    name: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def adapter_parameters(model: Any, name: str) -> dict[str, torch.Tensor]:
    """Adapter `name`'s parameters in `model`, by the key its files use."""
    marker = f".{name}."
    out = {}
    for key, param in model.named_parameters():
        if ".lora_" in key and marker in key:
            out[PEFT_PREFIX + key.replace(marker, ".")] = param
    return out


def has_adapter(model: Any, name: str) -> bool:
    return bool(adapter_parameters(model, name))


def load_adapter(
    model: Any, name: str, config: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    """Put adapter `name` into `model`: injected (frozen, eval mode) on its first load into
    exactly the layers its tensors name, with `config`'s rank and alpha (peft's `r`,
    `lora_alpha`, `use_rslora`); its tensors copied in on every load."""
    from peft import LoraConfig, inject_adapter_in_model

    if not has_adapter(model, name):
        layers = _check(name, _expected_shapes(model, name, config, tensors), tensors)
        peft_config = LoraConfig(
            r=int(config["r"]),
            lora_alpha=config["lora_alpha"],
            use_rslora=bool(config.get("use_rslora", False)),
            target_modules=sorted(layers),
            bias="none",
        )
        inject_adapter_in_model(peft_config, model, adapter_name=name)
        model.requires_grad_(False)
        model.eval()
    targets = adapter_parameters(model, name)
    _check(name, {k: tuple(v.shape) for k, v in targets.items()}, tensors)
    with torch.no_grad():
        for key, tensor in tensors.items():
            targets[key].copy_(tensor.to(targets[key].device, targets[key].dtype))


def _expected_shapes(
    model: Any, name: str, config: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> dict[str, tuple[int, ...]]:
    """The tensors a new adapter of rank `config["r"]` needs on the linear layers `tensors`
    name: A `[r, in]` and B `[out, r]` for each."""
    try:
        rank = int(config["r"])
        float(config["lora_alpha"])
    except (KeyError, TypeError, ValueError):
        raise WeightLoadError(
            f"adapter {name!r}: its config needs a rank `r` and `lora_alpha`"
        ) from None
    modules = dict(model.named_modules())
    expected: dict[str, tuple[int, ...]] = {}
    for key in tensors:
        layer, _, kind = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        module = modules.get(layer)
        if not key.startswith(PEFT_PREFIX) or kind not in ("A.weight", "B.weight"):
            continue  # reported as unknown
        if not isinstance(module, torch.nn.Linear):
            raise WeightLoadError(f"adapter {name!r}: {layer} is not a linear layer of the model")
        for side, shape in (("A", (rank, module.in_features)), ("B", (module.out_features, rank))):
            expected[f"{PEFT_PREFIX}{layer}.lora_{side}.weight"] = shape
    return expected


def _check(
    name: str, expected: dict[str, tuple[int, ...]], tensors: dict[str, torch.Tensor]
) -> set[str]:
    """Refuse `tensors` unless they are exactly `expected`; the layers they adapt."""
    unknown = sorted(set(tensors) - set(expected))
    missing = sorted(set(expected) - set(tensors))
    if unknown or missing or not tensors:
        raise WeightLoadError(
            f"adapter {name!r}: unknown tensors {unknown[:3]}, missing tensors {missing[:3]}"
        )
    for key, tensor in tensors.items():
        if tuple(tensor.shape) != expected[key]:
            raise WeightLoadError(
                f"adapter {name!r}: {key} has shape {tuple(tensor.shape)}, the model's layer "
                f"takes {expected[key]}"
            )
        if not torch.isfinite(tensor).all():
            raise WeightLoadError(f"adapter {name!r}: {key} contains NaN or infinity")
    return {k.removeprefix(PEFT_PREFIX).rpartition(".lora_")[0] for k in tensors}
