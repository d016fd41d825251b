"""Reductions that include every rank when a process group exists, and are local otherwise.

Everything that normalises by a batch statistic goes through here, so a result never depends on
how the batch was sharded over ranks, micro-batches or accumulation steps.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def all_reduce_sum(tensor: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """Sum `tensor` over the ranks of `process_group` (in place on a copy); local without one."""
    return _all_reduce(tensor, dist.ReduceOp.SUM, process_group)


def all_reduce_max(tensor: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """The elementwise largest `tensor` over the ranks of `process_group`; local without one."""
    return _all_reduce(tensor, dist.ReduceOp.MAX, process_group)


def _all_reduce(tensor: torch.Tensor, op: Any, process_group: Any) -> torch.Tensor:
    """`op` over the ranks, on a copy. NCCL reduces CUDA tensors only: a host tensor (a count,
    a metric) travels to this rank's GPU and back."""
    if not (process_group is not None or (dist.is_available() and dist.is_initialized())):
        return tensor.clone()
    if dist.get_backend(process_group) == "nccl" and tensor.device.type != "cuda":
        out = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(out, op=op, group=process_group)
        return out.to(tensor.device)
    out = tensor.clone()
    dist.all_reduce(out, op=op, group=process_group)
    return out


def global_token_count(loss_mask: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """The loss denominator for a whole optimizer step: the masked tokens of every micro-batch
    on every rank. Pass the concatenated masks of all micro-batches of the step; each micro-batch
    loss is then `sum(per_token * mask) / denominator`, and their sum is the step's token mean
    whatever the split."""
    count = loss_mask.detach().to(torch.float64).sum()
    return all_reduce_sum(count, process_group).clamp_min(1.0)
