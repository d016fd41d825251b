"""The learning-rate schedule and the optimizer step that may skip an update.

One `LambdaLR` (not `SequentialLR`, whose `load_state_dict` restores counters but never the
rate, so resumed steps diverge). `load_state_dict` writes the restored rate back into the
optimizer, so a run stopped and resumed at any step sees the same rates as one that never
stopped. Past `total_steps` the rate holds at its minimum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch.optim.lr_scheduler import LambdaLR

ScheduleKind = Literal["constant", "linear", "cosine"]


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, kind: ScheduleKind, min_lr_ratio: float
) -> float:
    """The multiplier of the base rate at optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps  # the first update already moves, at lr / warmup
    if kind == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    shape = 1.0 - progress if kind == "linear" else cosine
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


class ResumableLambdaLR(LambdaLR):
    """`LambdaLR` whose `load_state_dict` also restores the optimizer's current rates."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for group, base, fn in zip(
            self.optimizer.param_groups, self.base_lrs, self.lr_lambdas, strict=True
        ):
            group["lr"] = base * fn(self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def build_lr_schedule(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int,
    kind: ScheduleKind = "constant",
    min_lr_ratio: float = 0.0,
) -> ResumableLambdaLR:
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps: must be >= 0, got {warmup_steps}")
    if total_steps < 1:
        raise ValueError(f"total_steps: must be >= 1, got {total_steps}")
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps: {warmup_steps} exceeds total_steps {total_steps}")
    if kind not in ("constant", "linear", "cosine"):
        raise ValueError(f"kind: expected constant, linear or cosine, got {kind!r}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio: must be in [0, 1], got {min_lr_ratio}")

    def factor(step: int) -> float:
        return lr_factor(
            step,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            kind=kind,
            min_lr_ratio=min_lr_ratio,
        )

    fn: Callable[[int], float] = factor
    return ResumableLambdaLR(optimizer, fn)


def _global(norm: torch.Tensor) -> float:
    """A norm over sharded (DTensor) gradients is itself sharded: reduce it to every rank's
    same float."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR | None,
    max_grad_norm: float | None,
    *,
    skip_grad_norm: float | None = None,
    parameters: Iterable[torch.Tensor] | None = None,
) -> dict[str, float | bool]:
    """Clip, then step the optimizer and the schedule, unless the gradient is unusable.

    A non-finite gradient norm, or one above `skip_grad_norm`, skips the update: no optimizer
    step and no schedule step, so the schedule only counts updates that happened. Gradients are
    zeroed either way.
    """
    params = (
        list(parameters)
        if parameters is not None
        else [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    )
    limit = max_grad_norm if max_grad_norm is not None else math.inf
    norm = _global(torch.nn.utils.clip_grad_norm_(params, limit)) if params else 0.0
    applied = math.isfinite(norm) and (skip_grad_norm is None or norm <= skip_grad_norm)
    if applied:
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return {"applied": applied, "grad_norm": norm}
