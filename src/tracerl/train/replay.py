"""Routing replay: a mixture-of-experts model's trainer forward routed as the engine routed.

The engine's routers and the trainer's see slightly different numbers (another dtype, another
batch shape, other kernels), and where two experts' scores are close the top-k flips: the
trainer then computes a token's log-prob through other experts than the ones that sampled it,
and the train-inference mismatch grows far beyond a dense model's. With replay, each router's
top-k indices are the recorded ones (`tracerl.routing`), and its weights are the router's own
probabilities gathered at those experts (renormalised as the router does): the router's logits
are still computed from the live hidden states, so its gradient (and any load-balancing loss
over its logits) remains. A position with no record (padding, a sequence's last token, a turn
whose engine returned none) keeps the router's own choice.

`replayed(model, routing)` is a context: within it, every forward of `model` takes `routing`
(`[rows, width, layers, top_k]`, the micro-batch's cells, -1 where unrecorded) for its
routers in model order. Supported routers are those whose weights are softmax, top-k, then
optionally renormalised: Qwen2-MoE, Qwen3-MoE and Mixtral; another router is refused, since
replaying it with the wrong weights would train a different model than the engine sampled.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tracerl.routing import routers

REPLAYABLE = ("Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "MixtralTopKRouter")


def check_replayable(model: Any) -> int:
    """The number of routers `model` has (0: dense); `ValueError` naming the setting when it
    has routers replay does not support."""
    found = routers(model)
    other = sorted({type(r).__name__ for r in found} - set(REPLAYABLE))
    if other:
        raise ValueError(
            f"trainer.moe.routing = 'replay' replays {', '.join(REPLAYABLE)}, not "
            f"{', '.join(other)}; set trainer.moe.routing = 'recompute'"
        )
    return len(found)


def _renormalises(router: Any) -> bool:
    # Qwen2/3-MoE say so in their config; Mixtral always does
    return bool(getattr(router, "norm_topk_prob", True))


@contextmanager
def replayed(model: Any, routing: torch.Tensor | None) -> Iterator[None]:
    """Route `model`'s forwards within by `routing` (see the module docstring); None: as the
    model routes by itself."""
    if routing is None:
        yield
        return
    found = routers(model)
    if routing.shape[2] != len(found):
        raise ValueError(
            f"routed experts: the record has {routing.shape[2]} MoE layers, the model "
            f"{len(found)}: not this model's routing"
        )
    flat = routing.reshape(-1, routing.shape[2], routing.shape[3])  # [tokens, L, k]

    def hook_for(layer: int) -> Any:
        recorded = flat[:, layer]  # [tokens, k]
        known = (recorded >= 0).all(-1, keepdim=True)  # [tokens, 1]

        def hook(module: Any, args: Any, output: Any) -> Any:
            logits, scores, indices = output
            if indices.shape != recorded.shape:
                raise ValueError(
                    f"routed experts: router {layer} routes {tuple(indices.shape)} "
                    f"(tokens, top_k), the record holds {tuple(recorded.shape)}"
                )
            chosen = torch.where(known, recorded.to(indices.device, torch.long), indices)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            weights = probs.gather(-1, chosen)
            if _renormalises(module):
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(scores.dtype), chosen

        return hook

    handles = [r.register_forward_hook(hook_for(i)) for i, r in enumerate(found)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
