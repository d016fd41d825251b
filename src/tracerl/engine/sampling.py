"""Token sampling for a batch of rows with per-row settings and per-row random streams.

The reported log-probability of a sampled token is `log_softmax(logits / T)[token]`: the
temperature-scaled distribution *before* top-p / top-k truncation. That is what a trainer can
recompute from the same logits (`log_softmax(logits / T)`) without knowing the truncation, and it
is what `tracerl.train` computes. Greedy rows (`T == 0`) report `log_softmax(logits)[token]`.

Each row draws from its own `torch.Generator`, so a request's tokens depend on its seed and inputs,
not on which other requests share the batch. Sampling inverts the CDF: one uniform draw per row
from the row's generator, located in the row's cumulative distribution (summed in float64, so
rounding over a 50k vocabulary cannot bias the tail). That costs one draw per row instead of a
noise vector over the vocabulary, which on a CPU was a third of a 16-row decode step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowSampling:
    temperature: float
    top_p: float
    top_k: int  # <= 0 disables


def truncate(logprobs: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Set to -inf what top-k (`<= 0` off) and top-p (nucleus) exclude; `logprobs` is `[n, V]`."""
    sorted_lp, order = logprobs.sort(dim=-1, descending=True)  # [n, V]
    vocab = logprobs.shape[-1]
    ranks = torch.arange(vocab, device=logprobs.device)[None, :]  # [1, V]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]  # [n, 1]
    probs = sorted_lp.exp()
    mass_before = probs.cumsum(dim=-1) - probs  # [n, V]
    # Keep a token while the mass before it is under top_p; the first token is always kept.
    drop = (ranks >= k) | (mass_before >= top_p[:, None])
    drop[:, 0] = False
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    return torch.empty_like(logprobs).scatter_(-1, order, sorted_lp)


def sample(
    logits: torch.Tensor,
    rows: list[RowSampling],
    generators: list[torch.Generator],
    allowed: list[torch.Tensor | None] | None = None,
) -> tuple[list[int], list[float]]:
    """Sample one token per row of `logits` `[n, V]` (float32); return tokens and logprobs.
    `allowed`: per row, None or a `[V]` bool mask of the tokens a constraint permits (the
    reported log-prob stays the unmasked one, like truncation's; see `constraint.py`)."""
    n = logits.shape[0]
    device = logits.device
    temps = torch.tensor([r.temperature for r in rows], device=device)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, 1.0, temps)[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)  # [n, V]
    candidates = logprobs
    if any(r.top_p < 1.0 or r.top_k > 0 for r in rows):
        top_p = torch.tensor([r.top_p for r in rows], device=device)
        top_k = torch.tensor([r.top_k for r in rows], device=device)
        candidates = truncate(logprobs, top_p, top_k)
    if allowed is not None and any(a is not None for a in allowed):
        candidates = _constrain(logprobs, candidates, allowed)
    if bool(greedy.all()):
        tokens = candidates.argmax(dim=-1)
    else:
        uniform = torch.cat(
            [torch.rand(1, generator=g, device=device, dtype=torch.float64) for g in generators]
        )  # [n]
        cdf = candidates.exp().double().cumsum(dim=-1)  # [n, V], unnormalised after truncation
        target = (uniform * cdf[:, -1])[:, None]
        # side="right": the first index whose cdf exceeds the target, never a zero-mass token.
        drawn = torch.searchsorted(cdf, target, right=True)[:, 0].clamp_max(cdf.shape[-1] - 1)
        tokens = torch.where(greedy, candidates.argmax(dim=-1), drawn)
    picked = logprobs.gather(-1, tokens[:, None])[:, 0]
    assert picked.shape[0] == n
    return tokens.tolist(), picked.tolist()


def _constrain(
    logprobs: torch.Tensor, candidates: torch.Tensor, allowed: list[torch.Tensor | None]
) -> torch.Tensor:
    """`candidates` with what each row's constraint forbids at -inf. A row whose truncation
    removed every allowed token draws from the allowed ones untruncated: the constraint wins."""
    candidates = candidates.clone()
    for row, mask in enumerate(allowed):
        if mask is None:
            continue
        mask = mask.to(candidates.device)
        kept = candidates[row].masked_fill(~mask, float("-inf"))
        if bool(torch.isinf(kept).all()):
            kept = logprobs[row].masked_fill(~mask, float("-inf"))
        candidates[row] = kept
    return candidates
