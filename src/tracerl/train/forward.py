"""Model forwards over micro-batches: log-probs of action tokens and values before them.

Log-probs follow the engine's definition: `log_softmax(logits / T)` at the sampled token, before
any top-p / top-k truncation (`tracerl.engine.sampling`); T = 0 (greedy) is reported at T = 1.
A mixture-of-experts micro-batch with recorded routing is forwarded under it
(`tracerl.train.replay`). Logits are computed only where the next token is an action
(`logits_to_keep` with the micro-batch's boolean `keep`), so prompt and observation tokens
never reach the vocabulary head. The log-prob is `z[token] - logsumexp(z)`, which never
materialises a second `[k, V]` log-softmax for backward; the entropy (a metric, no grad)
reuses the same `logsumexp`. With `autocast` (a dtype, `trainer.autocast`) the model's forward
runs under `torch.autocast`; what comes out of it is cast to float32 before any log-prob.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from tracerl.train.batch import MicroBatch
from tracerl.train.replay import replayed

AUTOCAST = {"off": None, "bfloat16": torch.bfloat16}
"""`trainer.autocast` -> the dtype the forwards run under (None: no autocast)."""


@contextlib.contextmanager
def forwarding(model: Any, mb: MicroBatch, autocast: torch.dtype | None) -> Iterator[None]:
    """The context of one forward of `model` over `mb`: its recorded routing, under autocast."""
    with replayed(model, mb.routing):
        if autocast is None:
            yield
        else:
            with torch.autocast(mb.input_ids.device.type, dtype=autocast):
                yield


def action_logprobs(
    model: Any,
    mb: MicroBatch,
    temperature: float,
    *,
    with_entropy: bool = False,
    autocast: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `mb`'s action tokens `[k]` (with grad if enabled), and their entropies
    `[k]` (no grad) when asked."""
    by_mask = keeps_logits_by_mask(model.__class__)
    with forwarding(model, mb, autocast):
        logits = model(
            input_ids=mb.input_ids,
            position_ids=mb.position_ids,
            attention_mask=mb.attention_mask,
            logits_to_keep=mb.keep if by_mask else 0,
            use_cache=False,
        ).logits
    logits = (logits if by_mask else logits[mb.keep]).float()  # [k, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    chosen = logits.gather(-1, mb.tokens[:, None])[:, 0]  # [k]
    normaliser = torch.logsumexp(logits, dim=-1)  # [k]
    entropy = None
    if with_entropy:  # H = logsumexp(z) - sum(p z), reusing the normaliser: one pass fewer
        with torch.no_grad():
            z = logits.detach()
            probs = (z - normaliser.detach()[:, None]).exp_()  # [k, V]
            entropy = normaliser.detach() - (probs * z).sum(-1)
    return chosen - normaliser, entropy


@functools.cache
def keeps_logits_by_mask(cls: Any) -> bool:
    """Whether `cls` computes logits only at a 2D boolean `logits_to_keep` (its modeling module
    slices with transformers' `slice_logits_to_keep`, 5.21 and later). Older ones read a tensor
    as positions and fail: their logits are computed everywhere and masked afterwards."""
    module = sys.modules.get(getattr(cls.forward, "__module__", None) or "")
    return hasattr(module, "slice_logits_to_keep")


def action_values(critic: Any, mb: MicroBatch, autocast: torch.dtype | None = None) -> torch.Tensor:
    """The critic's value of the state before each action token of `mb`. `[k]`"""
    with forwarding(critic, mb, autocast):
        values: torch.Tensor = critic(
            mb.input_ids,
            keep=mb.keep,
            position_ids=mb.position_ids,
            attention_mask=mb.attention_mask,
        )
    return values.float()


@torch.no_grad()
def all_logprobs(
    model: Any,
    mbs: list[MicroBatch],
    size: int,
    temperature: float,
    device: torch.device,
    padding: Sequence[MicroBatch] = (),
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """Log-probs over a step's packed layout of `size` tokens (0 off actions). `[N]`
    `padding`: forwards whose outputs are discarded (a sharded trainer's lockstep)."""
    out = torch.zeros(size, dtype=torch.float32, device=device)
    for mb in mbs:
        out[mb.actions] = action_logprobs(model, mb, temperature, autocast=autocast)[0]
    for mb in padding:
        action_logprobs(model, mb, temperature, autocast=autocast)
    return out


@torch.no_grad()
def all_values(
    critic: Any,
    mbs: list[MicroBatch],
    size: int,
    device: torch.device,
    padding: Sequence[MicroBatch] = (),
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """Values over a step's packed layout of `size` tokens (0 off actions). `[N]`"""
    out = torch.zeros(size, dtype=torch.float32, device=device)
    for mb in mbs:
        out[mb.actions] = action_values(critic, mb, autocast)
    for mb in padding:
        action_values(critic, mb, autocast)
    return out
