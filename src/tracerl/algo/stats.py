"""Statistics from sums that can be all-reduced across ranks."""

from __future__ import annotations

from typing import Any

import torch

from tracerl.algo.distributed import all_reduce_sum

# Below this return variance the ratio in explained variance is noise, not a critic signal.
MIN_RETURN_VARIANCE = 1e-8


def explained_variance(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    process_group: Any = None,
    min_variance: float = MIN_RETURN_VARIANCE,
) -> float | None:
    """`1 - Var(R - V) / Var(R)` over masked tokens of every rank; `None` when `Var(R)` is too
    small to divide by. 1 is a perfect critic, 0 predicts no better than the mean return."""
    if values.shape != returns.shape or mask.shape != values.shape:
        raise ValueError("values, returns and mask must have the same shape")
    m = mask.to(torch.float64)
    r = returns.detach().to(torch.float64) * m
    e = (returns.detach().to(torch.float64) - values.detach().to(torch.float64)) * m
    sums = all_reduce_sum(
        torch.stack([m.sum(), r.sum(), (r * r).sum(), e.sum(), (e * e).sum()]), process_group
    )
    n = float(sums[0])
    if n < 2:
        return None
    var_r = float(sums[2]) / n - (float(sums[1]) / n) ** 2
    var_e = float(sums[4]) / n - (float(sums[3]) / n) ** 2
    if var_r < min_variance:
        return None
    return 1.0 - var_e / var_r
