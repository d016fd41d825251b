"""Loading new weights into a running model, all or nothing.

A weight update is validated completely (names, shapes, coverage) before a single parameter is
written, so a bad checkpoint leaves the engine serving its previous weights and version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tracerl.engine.types import WeightLoadError
from tracerl.models import read_safetensors

__all__ = ["WeightLoadError", "copy_weights", "read_weights_dir"]


def read_weights_dir(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the `*.safetensors` files in a Hugging Face model directory."""
    if not path.is_dir():
        raise WeightLoadError(f"model_path {str(path)!r} is not a directory")
    try:
        return read_safetensors(path)
    except FileNotFoundError:
        raise WeightLoadError(f"model_path {str(path)!r} has no .safetensors files") from None


def copy_weights(model: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Copy `tensors` into `model`'s parameters and buffers by name, validating everything first.

    Every parameter storage must be covered by some name (tied weights count once), so a partial
    checkpoint cannot leave a mix of old and new weights.
    """
    targets = dict(model.named_parameters(remove_duplicate=False))
    unknown = sorted(set(tensors) - set(targets))
    if unknown:
        raise WeightLoadError(
            f"unknown weight names: {unknown[:5]}{'...' if len(unknown) > 5 else ''}"
        )
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(targets[name].shape):
            raise WeightLoadError(
                f"weight {name}: shape {tuple(tensor.shape)} does not match the model's "
                f"{tuple(targets[name].shape)}"
            )
        if not torch.isfinite(tensor).all():
            raise WeightLoadError(f"weight {name}: contains NaN or infinity")
    covered = {targets[name].data_ptr() for name in tensors}
    missing = sorted(n for n, p in targets.items() if p.data_ptr() not in covered)
    if missing:
        raise WeightLoadError(f"missing weights: {missing[:5]}{'...' if len(missing) > 5 else ''}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            targets[name].copy_(tensor.to(targets[name].device, targets[name].dtype))
