"""Losses: PPO clipped policy loss (with dual clip and truncated importance sampling), clipped
value loss, KL estimators and penalties, entropy, and the aggregation modes they share.

Aggregation (`agg`) over a packed batch:
- `token_mean`: sum over action tokens / the number of action tokens. Pass `denominator`
  (see `tracerl.algo.distributed.global_token_count`) to divide by the whole step's count, so
  micro-batch losses add up to the same value however the batch is split.
- `seq_mean_token_sum`: mean over trajectories of each one's token sum (needs `cu_seqlens`).
- `seq_mean_token_mean`: mean over trajectories of each one's token mean (needs `cu_seqlens`).

`loss_mask` selects the action tokens of a full token layout (prompt and tool tokens 0). Without
it every token is an action token: the trainer's layout, whose micro-batch tensors are gathered
over action tokens before they reach a loss (`tracerl.train.forward`), with `cu_seqlens` over
those tokens. Both give the same loss (tested).
"""

from __future__ import annotations

from typing import Literal

import torch

Agg = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]
KLEstimator = Literal["k1", "k2", "k3"]


def aggregate(
    per_token: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    agg: Agg = "token_mean",
    cu_seqlens: torch.Tensor | None = None,
    denominator: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Reduce a per-token quantity `[T]` over the action tokens as `agg` says."""
    mask = _actions(loss_mask, per_token, "per_token").to(per_token.dtype)
    masked = per_token * mask
    if agg == "token_mean":
        denom = mask.sum().clamp_min(1.0) if denominator is None else denominator
        return masked.sum() / torch.as_tensor(denom, dtype=masked.dtype, device=masked.device)
    if agg not in ("seq_mean_token_sum", "seq_mean_token_mean"):
        raise ValueError(
            f"agg: expected token_mean, seq_mean_token_sum or seq_mean_token_mean, got {agg!r}"
        )
    if cu_seqlens is None:
        raise ValueError(f"cu_seqlens: required for agg={agg!r}")
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=per_token.device), lengths)
    sums = torch.zeros(lengths.numel(), dtype=per_token.dtype, device=per_token.device)
    sums = sums.index_add(0, seq, masked)
    if agg == "seq_mean_token_mean":
        counts = torch.zeros_like(sums).index_add(0, seq, mask).clamp_min(1.0)
        sums = sums / counts
    denom = float(lengths.numel()) if denominator is None else denominator
    return sums.sum() / torch.as_tensor(denom, dtype=sums.dtype, device=sums.device)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: Agg = "token_mean",
    cu_seqlens: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    denominator: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate `max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`.

    `dual_clip = c > 1` also bounds the loss of negative-advantage tokens by `-A c` (Dual-clip
    PPO), so a huge ratio on a bad token cannot dominate. With `rollout_logprobs`, each token is
    weighted by the truncated importance ratio `min(exp(old - rollout), tis_cap)` (no gradient),
    which corrects for the inference engine sampling from slightly different numbers than the
    trainer computes.
    """
    for name, t in (("old_logprobs", old_logprobs), ("advantages", advantages)):
        if t.shape != logprobs.shape:
            raise ValueError(
                f"{name}: shape {tuple(t.shape)} does not match logprobs {tuple(logprobs.shape)}"
            )
    if clip_low < 0 or clip_high < 0:
        raise ValueError("clip_low, clip_high: must be >= 0")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip: must be > 1, got {dual_clip}")
    # float32 whatever the inputs: a bfloat16 difference of log-probs is too coarse for a ratio
    logprobs, old_logprobs, advantages = logprobs.float(), old_logprobs.float(), advantages.float()
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_hit = torch.zeros_like(per_token, dtype=torch.bool)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_hit = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual_hit, bound, per_token)
    mask = _actions(loss_mask, logprobs, "logprobs")
    metrics: dict[str, float] = {}
    if rollout_logprobs is not None:
        if rollout_logprobs.shape != logprobs.shape:
            raise ValueError("rollout_logprobs: shape does not match logprobs")
        is_weight = torch.exp(old_logprobs - rollout_logprobs.float()).detach()
        if tis_cap is not None:
            metrics["tis_clip_frac"] = _masked_mean((is_weight > tis_cap).float(), mask)
            is_weight = is_weight.clamp(max=tis_cap)
        per_token = per_token * is_weight
        metrics["is_weight_mean"] = _masked_mean(is_weight, mask)
        metrics["is_weight_max"] = _masked_max(is_weight, mask)
    loss = aggregate(per_token, mask, agg, cu_seqlens, denominator)
    with torch.no_grad():
        metrics.update(
            {
                "clip_frac": _masked_mean((clipped > unclipped).float(), mask),
                "dual_clip_frac": _masked_mean(dual_hit.float(), mask),
                # k3 estimate of KL(old || new) from samples of the old policy
                "approx_kl": _masked_mean(torch.exp(-log_ratio) - 1 + log_ratio, mask),
                "ratio_mean": _masked_mean(ratio, mask),
                "ratio_max": _masked_max(ratio, mask),
                "ratio_min": -_masked_max(-ratio, mask),
            }
        )
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    *,
    clip: float | None = None,
    agg: Agg = "token_mean",
    cu_seqlens: torch.Tensor | None = None,
    denominator: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)`; plain MSE without `clip`.

    Clipping keeps the critic in a trust region around its pre-update values while rollouts are
    reused over several passes, taking the larger of the two errors.
    """
    for name, t in (("old_values", old_values), ("returns", returns)):
        if t.shape != values.shape:
            raise ValueError(
                f"{name}: shape {tuple(t.shape)} does not match values {tuple(values.shape)}"
            )
    values, old_values, returns = values.float(), old_values.float(), returns.float()
    unclipped = (values - returns) ** 2
    mask = _actions(loss_mask, values, "values")
    if clip is None:
        per_token = 0.5 * unclipped
        clip_frac = 0.0
    else:
        if clip <= 0:
            raise ValueError(f"clip: must be > 0, got {clip}")
        clipped_v = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (clipped_v - returns) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        clip_frac = _masked_mean((clipped > unclipped).float(), mask)
    loss = aggregate(per_token, mask, agg, cu_seqlens, denominator)
    return loss, {
        "value_clip_frac": clip_frac,
        "value_mean": _masked_mean(values.detach(), mask),
        "return_mean": _masked_mean(returns.detach(), mask),
    }


def kl_per_token(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimates of KL(policy || reference) from tokens the policy sampled.

    With `d = logprobs - ref_logprobs`: k1 = d (unbiased, can be negative), k2 = d^2 / 2,
    k3 = exp(-d) - 1 + d (unbiased and non-negative). Computed in float32 whatever the input
    dtype: the difference of two bfloat16 log-probs near -2 has 1/64 resolution, as large as
    the divergence it measures.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError("ref_logprobs: shape does not match logprobs")
    d = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(-d) - 1 + d
    raise ValueError(f"estimator: expected k1, k2 or k3, got {estimator!r}")


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    *,
    estimator: KLEstimator = "k3",
    coef: float = 1.0,
    agg: Agg = "token_mean",
    cu_seqlens: torch.Tensor | None = None,
    denominator: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """`coef` times the aggregated `kl_per_token`: the loss-side KL of group-baseline methods."""
    return coef * aggregate(
        kl_per_token(logprobs, ref_logprobs, estimator), loss_mask, agg, cu_seqlens, denominator
    )


def kl_in_reward(
    token_rewards: torch.Tensor, kl: torch.Tensor, beta: float, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Subtract `beta * kl` from action-token rewards before GAE (classic RLHF PPO): the penalty
    is discounted and bootstrapped like any reward, so the critic learns to predict it."""
    if kl.shape != token_rewards.shape or loss_mask.shape != token_rewards.shape:
        raise ValueError("kl, loss_mask: shapes must match token_rewards")
    return token_rewards - beta * kl * loss_mask.to(kl.dtype)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension: `logsumexp(z) - sum(p z)`."""
    z = logits.float()
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)


def _actions(loss_mask: torch.Tensor | None, like: torch.Tensor, name: str) -> torch.Tensor:
    """The boolean action-token mask: `loss_mask`, or every token of `like`."""
    if loss_mask is None:
        return torch.ones(like.shape, dtype=torch.bool, device=like.device)
    if loss_mask.shape != like.shape:
        raise ValueError(
            f"loss_mask: shape {tuple(loss_mask.shape)} does not match {name} {tuple(like.shape)}"
        )
    return loss_mask.bool()


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = int(mask.sum())
    return float(x.detach()[mask].float().sum() / n) if n else 0.0


def _masked_max(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(x.detach()[mask].max()) if bool(mask.any()) else 0.0
