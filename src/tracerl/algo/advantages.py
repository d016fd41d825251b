"""Advantages: terminal rewards, GAE over action tokens, group baselines, whitening.

GAE walks action tokens only: observation tokens between turns neither receive an advantage nor
discount the chain, each trajectory's last action bootstraps from 0, and packed boundaries reset
the recursion. It runs as a blocked scan on the compacted action sequence (see `_reverse_scan`),
a fixed handful of tensor ops per level, identical on CPU and GPU, and exact for any length: no
global `(gamma * lam) ** t` weighting, which underflows past a few thousand tokens.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from tracerl.algo.distributed import all_reduce_sum

# Block length of the scan: long enough that few levels are needed (32k actions: three), short
# enough that in-block weights stay far from float32's limits and the in-block sums stay exact.
SCAN_BLOCK = 32
# In-block weights are rescaled by g ** -i; keep g ** (block - 1) above this so they stay finite.
MIN_BLOCK_WEIGHT = 1e-20
# A chain weight this small moves a float32 result by less than its last bit.
NEGLIGIBLE_WEIGHT = 1e-9


def check_packing(name: str, tensor: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
    if tensor.dim() != 1:
        raise ValueError(
            f"{name}: expected a packed 1-d tensor [T], got shape {tuple(tensor.shape)}"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or cu_seqlens.dtype != torch.int64:
        raise ValueError("cu_seqlens: expected a 1-d int64 tensor [0, ..., T]")
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != tensor.shape[0]:
        raise ValueError(
            f"cu_seqlens: must start at 0 and end at T={tensor.shape[0]}, got "
            f"{int(cu_seqlens[0])}..{int(cu_seqlens[-1])}"
        )
    if cu_seqlens.numel() > 1 and bool((cu_seqlens[1:] <= cu_seqlens[:-1]).any()):
        raise ValueError("cu_seqlens: boundaries must be strictly increasing")


def _same_shape(name: str, tensor: torch.Tensor, like: torch.Tensor) -> None:
    if tensor.shape != like.shape:
        raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not match {tuple(like.shape)}")


def terminal_rewards(
    scores: torch.Tensor, loss_mask: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """Each trajectory's score on its last action token, zero elsewhere. `scores` is `[B]`."""
    check_packing("loss_mask", loss_mask, cu_seqlens)
    n = cu_seqlens.numel() - 1
    if scores.shape != (n,):
        raise ValueError(f"scores: expected shape ({n},), got {tuple(scores.shape)}")
    actions = loss_mask.bool()
    positions = torch.arange(loss_mask.shape[0], device=loss_mask.device)
    traj = torch.searchsorted(cu_seqlens, positions, right=True) - 1  # [T]
    last = torch.full((n,), -1, dtype=torch.int64, device=loss_mask.device)
    last.scatter_reduce_(0, traj[actions], positions[actions], reduce="amax")
    empty = (last < 0) & (scores != 0)
    if bool(empty.any()):
        which = int(empty.nonzero()[0])
        raise ValueError(f"scores: trajectory {which} has a non-zero score but no action tokens")
    out = torch.zeros(loss_mask.shape, dtype=scores.dtype, device=scores.device)
    has = last >= 0
    out[last[has]] = scores[has]
    return out


def gae(
    values: torch.Tensor,
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over action tokens; returns `(advantages, returns)`.

    For the actions a_1..a_n of one trajectory, `delta_i = r_i + gamma * V_{i+1} - V_i` with
    `V_{n+1} = 0`, and `A_i = delta_i + gamma * lam * A_{i+1}`. `returns = advantages + values`
    on action tokens; both are 0 elsewhere.
    """
    check_packing("values", values, cu_seqlens)
    _same_shape("token_rewards", token_rewards, values)
    _same_shape("loss_mask", loss_mask, values)
    for name, x in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= x <= 1.0 or math.isnan(x):
            raise ValueError(f"{name}: must be in [0, 1], got {x}")
    actions = loss_mask.bool()
    if bool((token_rewards.masked_fill(actions, 0) != 0).any()):
        raise ValueError("token_rewards: non-zero outside loss_mask (rewards belong to actions)")
    idx = actions.nonzero().squeeze(1)  # [N] positions of action tokens
    v = values.float()[idx]
    r = token_rewards.float()[idx]
    traj = torch.searchsorted(cu_seqlens, idx, right=True)  # [N] trajectory of each action
    last = torch.ones_like(idx, dtype=torch.bool)
    last[:-1] = traj[1:] != traj[:-1]  # the final action of its trajectory
    v_next = torch.zeros_like(v)
    v_next[:-1] = v[1:]
    delta = r + gamma * v_next.masked_fill(last, 0.0) - v
    adv_actions = _reverse_scan(delta, last, gamma * lam)
    advantages = torch.zeros(values.shape, dtype=torch.float32, device=values.device)
    returns = torch.zeros_like(advantages)
    advantages[idx] = adv_actions
    returns[idx] = adv_actions + v
    return advantages.to(values.dtype), returns.to(values.dtype)


def _reverse_scan(delta: torch.Tensor, cut: torch.Tensor, g: float) -> torch.Tensor:
    """`A_i = delta_i + g * A_{i+1}`, with the chain cut after every position where `cut`.

    Blocked: within a block of `k` elements, `A_i = g^-i (S_i - S_{e+1})` where `S` is the
    reversed cumulative sum of `g^j delta_j` and `e` the first cut at or after `i`. The blocks'
    first elements form the same recurrence one level up, with weight `g^k` and a cut wherever a
    block holds one; their results flow back into each position not cut off from its block's end
    through `g^(k - i)`. A weight below `NEGLIGIBLE_WEIGHT` contributes less than float32 can
    represent, so the recursion stops there.
    """
    n = delta.shape[0]
    if n == 0 or g < NEGLIGIBLE_WEIGHT:
        return delta.clone()
    k = SCAN_BLOCK
    while k > 2 and g ** (k - 1) < MIN_BLOCK_WEIGHT:
        k //= 2
    m = -(-n // k)
    pad = m * k - n
    d = torch.nn.functional.pad(delta, (0, pad)).view(m, k)  # [M, K]
    c = torch.nn.functional.pad(cut, (0, pad), value=True).view(m, k)  # [M, K]
    j = torch.arange(k, device=delta.device)
    powers = torch.tensor([g**i for i in range(k + 1)], device=delta.device)  # [K + 1] g^i
    w = powers[:k]
    s = (d * w).flip(1).cumsum(1).flip(1)  # S_i = sum_{j >= i} g^j d_j
    cut_at = torch.where(c, j, k).flip(1).cummin(1).values.flip(1)  # first cut at or after i
    s_after = torch.nn.functional.pad(s, (0, 1)).gather(1, (cut_at + 1).clamp_max(k))
    local = (s - s_after) / w  # [M, K]
    if m == 1:
        return local.reshape(-1)[:n]
    starts = _reverse_scan(local[1:, 0].contiguous(), c[1:].any(1), g**k)  # [M - 1]
    carry = torch.cat([starts, starts.new_zeros(1)])  # A at the next block's start
    tail = torch.where(cut_at == k, powers.flip(0)[:k], 0.0)  # g^(k - i) if not cut off
    return (local + tail * carry[:, None]).reshape(-1)[:n]


def _group_sums(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-trajectory float64 reward, its group's size and sum, and the group index."""
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError("rewards and group_ids: expected 1-d tensors of the same length")
    r = rewards.double()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(groups, dtype=torch.float64, device=r.device)
    count = count.index_add(0, inverse, torch.ones_like(r))
    total = torch.zeros_like(count).index_add(0, inverse, r)
    return r, count, total, inverse


def uniform_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """True for trajectories whose group has a single reward value (no signal for a group
    baseline: their advantage is 0). Count them, or drop them before training."""
    r, count, _, inverse = _group_sums(rewards, group_ids)
    lo = torch.full_like(count, math.inf).scatter_reduce(0, inverse, r, reduce="amin")
    hi = torch.full_like(count, -math.inf).scatter_reduce(0, inverse, r, reduce="amax")
    return (hi == lo)[inverse]


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    method: Literal["grpo", "dr_grpo", "rloo"] = "grpo",
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One advantage per trajectory from its group's rewards.

    - `grpo`: `(r - mean) / (std + eps)` (population std of the group) when `std_normalize`.
    - `dr_grpo`: `r - mean` (Dr. GRPO drops the std division and length normalisation).
    - `rloo`: `r - mean of the others` (leave-one-out; a group of one gets 0).
    Uniform-reward groups (`uniform_groups`) get exactly 0.
    """
    if method not in ("grpo", "dr_grpo", "rloo"):
        raise ValueError(f"method: expected grpo, dr_grpo or rloo, got {method!r}")
    r, count, total, inverse = _group_sums(rewards, group_ids)
    mean = (total / count)[inverse]
    if method == "grpo":
        sq = torch.zeros_like(count).index_add(0, inverse, (r - mean) ** 2)
        std = (sq / count).sqrt()[inverse]
        adv = (r - mean) / (std + eps) if std_normalize else r - mean
    elif method == "dr_grpo":
        adv = r - mean
    else:
        n = count[inverse]
        others = (total[inverse] - r) / (n - 1).clamp_min(1)
        adv = torch.where(n > 1, r - others, torch.zeros_like(r))
    adv = torch.where(uniform_groups(rewards, group_ids), torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    process_group: Any = None,
    eps: float = 1e-8,
    shift_mean: bool = True,
) -> torch.Tensor:
    """`(x - mean) / std` over masked elements of every rank; 0 where `mask` is 0.

    Moments come from all-reduced sums (count, sum, sum of squares in float64), so the result
    does not depend on how the batch is sharded.
    """
    _same_shape("mask", mask, x)
    m = mask.to(torch.float64)
    xd = x.to(torch.float64) * m
    stats = all_reduce_sum(torch.stack([m.sum(), xd.sum(), (xd * xd).sum()]), process_group)
    count = stats[0].clamp_min(1.0)
    mean = stats[1] / count
    var = (stats[2] / count - mean * mean).clamp_min(0.0)
    # Bessel's correction, as the usual PPO whitening does
    var = var * count / (count - 1).clamp_min(1.0)
    out = (x.to(torch.float64) - (mean if shift_mean else 0.0)) / (var.sqrt() + eps)
    return (out * m).to(x.dtype)
