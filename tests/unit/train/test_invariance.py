"""However a mini-batch is cut into micro-batches (one, several, one sample each; packed or
padded), the accumulated loss and gradients are the same: one denominator per update."""

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tracerl.train.batch import Batching, PackedBatch
from tracerl.train.models import value_model_from_actor
from tracerl.train.shard import Shard
from tracerl.train.update import ActorTargets, Metrics, update_actor, update_critic

from .conftest import config, make_samples

CUTS: list[tuple[Batching, int]] = [
    ("pack", 10_000), ("pack", 24), ("pack", 2), ("bucket", 10_000), ("bucket", 40),
    ("pad", 10_000), ("pad", 40),
]  # fmt: skip


class RecordGradients(torch.optim.Optimizer):
    """An optimizer that only records the gradient it is asked to apply."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params, {"lr": 0.0})
        self.seen: list[list[torch.Tensor]] = []

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        params = [p for group in self.param_groups for p in group["params"]]
        self.seen.append(
            [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        )


def run(
    model: torch.nn.Module, which: str, batching: Batching, budget: int, agg: str
) -> tuple[float, list[torch.Tensor]]:
    samples = make_samples(4, count=6)
    batch = PackedBatch.build(samples, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    cfg = config(
        batching=batching, token_budget=budget, loss_agg=agg, kl_loss_coef=0.1,
        actor={"max_grad_norm": None}, critic={"max_grad_norm": None},
    )  # fmt: skip
    opt = RecordGradients([p for p in model.parameters() if p.requires_grad])
    metrics = Metrics()
    noise = torch.randn(batch.token_ids.shape, generator=g)
    if which == "actor":
        targets = ActorTargets(
            advantages=noise * batch.loss_mask,
            old_logprobs=None,
            ref_logprobs=batch.rollout_logprobs + 0.1 * batch.loss_mask,
        )
        update_actor(model, opt, None, batch, Shard.whole(6), targets, cfg, g, metrics, batching)
        loss = metrics.result()["actor/policy_loss"] + metrics.result()["actor/kl_loss"]
    else:
        returns = (noise + 1) * batch.loss_mask
        update_critic(
            model, opt, None, batch, Shard.whole(6), 0.5 * returns, returns, cfg, g, metrics,
            batching,
        )  # fmt: skip
        loss = metrics.result()["critic/value_loss"]
    assert len(opt.seen) == 1
    return loss, opt.seen[0]


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_actor_loss_and_gradients_do_not_depend_on_the_cut(tiny: tuple[Any, Any], agg: str) -> None:
    results = [run(copy.deepcopy(tiny[0]), "actor", b, n, agg) for b, n in CUTS]
    loss, grads = results[0]
    assert loss != 0.0
    for other_loss, other_grads in results[1:]:
        assert other_loss == pytest.approx(loss, rel=1e-5, abs=1e-7)
        for a, b in zip(grads, other_grads, strict=True):
            torch.testing.assert_close(b, a)


def test_critic_loss_and_gradients_do_not_depend_on_the_cut(tiny: tuple[Any, Any]) -> None:
    critic = value_model_from_actor(tiny[0])
    results = [run(copy.deepcopy(critic), "critic", b, n, "token_mean") for b, n in CUTS]
    loss, grads = results[0]
    assert loss > 0
    for other_loss, other_grads in results[1:]:
        assert other_loss == pytest.approx(loss, rel=1e-5)
        for a, b in zip(grads, other_grads, strict=True):
            torch.testing.assert_close(b, a)
