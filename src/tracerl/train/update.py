"""Gradient updates of the actor and the critic over a step's batch, and their metrics.

One update = one mini-batch: its micro-batches' losses are divided by one denominator for the
whole mini-batch on every rank (`tracerl.algo.distributed`), their gradients accumulate, then
`optimizer_step` clips and steps (or skips an unusable gradient, schedule included). So the
update does not depend on how the mini-batch is cut into micro-batches. Epochs reshuffle the
trained samples with a generator seeded by (seed, step), which a resumed run reproduces.

The losses are `tracerl.algo.losses`, evaluated on action tokens only: each micro-batch's
tensors are `[k]` over its actions (gathered by the loss mask), so the losses take no mask and
masked tokens never enter a loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tracerl.algo.advantages import terminal_rewards
from tracerl.algo.distributed import all_reduce_max, all_reduce_sum, global_token_count
from tracerl.algo.losses import kl_in_reward, kl_penalty, kl_per_token, policy_loss, value_loss
from tracerl.algo.stats import explained_variance
from tracerl.config.train import TrainerConfig
from tracerl.train.batch import Batching, MicroBatch, PackedBatch, micro_batches_for
from tracerl.train.forward import AUTOCAST, action_logprobs, action_values
from tracerl.train.schedule import optimizer_step
from tracerl.train.shard import Shard, reshard


@dataclass
class Metrics:
    """Metric sums of one step that reduce over every rank.

    `mean(name, value, weight)`: a weighted mean (token-weighted fractions, per-token means).
    `add(name, value)`: a rank's share of a per-update total (a loss divided by the global
    denominator); summed over ranks and micro-batches, averaged over the updates of the name's
    model (`count_update`, the prefix before "/").
    `set(name, value)`: a value that is the same on every rank (a rate, a time, a count).
    """

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)
    updates: dict[str, int] = field(default_factory=dict)
    fixed: dict[str, float] = field(default_factory=dict)

    def mean(self, name: str, value: float, weight: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def add(self, name: str, value: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + value

    def count_update(self, model: str) -> None:
        self.updates[model] = self.updates.get(model, 0) + 1

    def set(self, name: str, value: float) -> None:
        self.fixed[name] = value

    def result(self, process_group: Any = None) -> dict[str, float]:
        means, totals = self._names(process_group)
        packed = torch.tensor(
            [self.sums.get(k, 0.0) for k in means]
            + [self.weights.get(k, 0.0) for k in means]
            + [self.totals.get(k, 0.0) for k in totals],
            dtype=torch.float64,
        )
        reduced = all_reduce_sum(packed, process_group).tolist() if packed.numel() else []
        out = dict(self.fixed)
        n = len(means)
        for i, k in enumerate(means):
            out[k] = reduced[i] / reduced[n + i] if reduced[n + i] > 0 else 0.0
        for i, k in enumerate(totals):
            out[k] = reduced[2 * n + i] / max(1, self.updates.get(k.split("/")[0], 1))
        return out

    def _names(self, process_group: Any) -> tuple[list[str], list[str]]:
        """The metric names of every rank: a rank that forwarded nothing real (its share was
        all zero-gradient samples, only lockstep padding) recorded fewer, and the reduction
        must have the same length everywhere."""
        names = (sorted(self.sums), sorted(self.totals))
        if not (dist.is_available() and dist.is_initialized()):
            return names
        every: list[Any] = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(every, names, group=process_group)
        return (
            sorted({k for means, _ in every for k in means}),
            sorted({k for _, totals in every for k in totals}),
        )


def token_stats(x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean, std, min and max of `x` over `mask`ed tokens of every rank."""
    m = mask.bool()
    v = x.detach()[m].double()
    sums = all_reduce_sum(
        torch.stack([v.new_tensor(float(v.numel())), v.sum(), (v * v).sum()])
    ).tolist()
    n = max(sums[0], 1.0)
    mean = sums[1] / n
    inf = v.new_tensor(float("inf"))
    extremes = all_reduce_max(
        torch.stack([v.max() if v.numel() else -inf, -v.min() if v.numel() else -inf])
    )
    return {
        "mean": mean,
        "std": max(sums[2] / n - mean * mean, 0.0) ** 0.5,
        "max": float(extremes[0]),
        "min": -float(extremes[1]),
    }


@dataclass
class ActorTargets:
    """What the actor update trains toward, over the step's packed layout."""

    advantages: torch.Tensor  # [N]
    old_logprobs: torch.Tensor | None  # [N]; None: the update's own first forward (one update)
    ref_logprobs: torch.Tensor | None  # [N] when a KL loss is configured


def ppo_rewards(
    batch: PackedBatch,
    config: TrainerConfig,
    behaviour: torch.Tensor,
    ref: torch.Tensor | None,
    metrics: Metrics,
) -> torch.Tensor:
    """A PPO step's per-token rewards `[N]`: each trajectory's score on its last action token,
    minus `kl_reward_coef` x the KL of the `behaviour` log-probs to `ref` on every action."""
    mask = batch.loss_mask
    rewards = terminal_rewards(batch.rewards, mask, batch.cu_seqlens)
    if config.kl_reward_coef == 0:
        return rewards
    assert ref is not None
    kl = kl_per_token(behaviour, ref, config.kl_estimator) * mask
    metrics.mean("kl/ref_mean", float(kl.sum() / mask.sum().clamp_min(1)), float(mask.sum()))
    return kl_in_reward(rewards, kl, config.kl_reward_coef, mask)


def critic_metrics(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, metrics: Metrics
) -> None:
    """The critic's explained variance and mean value and return over the action tokens."""
    ev = explained_variance(values, returns, mask)
    if ev is not None:
        metrics.set("critic/explained_variance", ev)
    for name, x in (("value", values), ("return", returns)):
        metrics.set(f"critic/{name}_mean", token_stats(x, mask)["mean"])


def shuffled_parts(
    samples: Sequence[int], parts: int, epochs: int, generator: torch.Generator
) -> list[list[int]]:
    """`epochs` passes over `samples`, each shuffled (when there is more than one update) and
    cut into `min(parts, len(samples))` mini-batches."""
    parts = min(parts, len(samples))
    out: list[list[int]] = []
    for _ in range(epochs):
        order = list(samples)
        if parts > 1 or epochs > 1:
            perm = torch.randperm(len(order), generator=generator).tolist()
            order = [order[i] for i in perm]
        out += [chunk.tolist() for chunk in torch.tensor(order).tensor_split(parts)]
    return out


def denominator(batch: PackedBatch, part: Sequence[int], agg: str) -> torch.Tensor:
    """The one denominator of an update: action tokens (token_mean) or trajectories, all ranks
    (a rank's share of a mini-batch may be empty)."""
    if agg == "token_mean":
        mask = batch.loss_mask[batch.token_index(part)] if part else batch.loss_mask[:0]
        return global_token_count(mask)
    count = torch.tensor(float(len(part)), dtype=torch.float64)
    return all_reduce_sum(count).clamp_min(1.0)


def _update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: PackedBatch,
    parts: list[list[int]],
    config: TrainerConfig,
    agg: str,
    backward: Callable[[MicroBatch, torch.Tensor, int], None],
    prefix: str,
    metrics: Metrics,
    batching: Batching,
    shard: Shard,
    padding: Callable[[MicroBatch], None],
    zero_grad: frozenset[int] = frozenset(),
) -> None:
    optim = config.actor if prefix == "actor" else config.critic
    reshard(model)  # after no-grad passes, the sharded parameters are the ones to update
    params = [p for p in model.parameters() if p.requires_grad]
    skipped, norms = 0, []
    for index, part in enumerate(parts):
        denom = denominator(batch, part, agg)
        computed = [i for i in part if i not in zero_grad]
        mbs = micro_batches_for(batch, computed, config, batching) if computed else []
        extra = shard.padding(mbs, batch.token_ids.device, batching)  # before any forward
        for mb in mbs:
            backward(mb, denom, index)
        for mb in extra:
            padding(mb)
        for p in params:  # what a forward of the zero-gradient samples would have left
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        result = optimizer_step(
            optimizer,
            scheduler,
            optim.max_grad_norm,
            skip_grad_norm=optim.skip_grad_norm,
            parameters=params,
        )
        metrics.count_update(prefix)
        skipped += 0 if result["applied"] else 1
        norms.append(float(result["grad_norm"]))
    # The norm is global already (clipping reduces it over ranks); the mean over updates, and
    # the largest, which shows a skipped update's non-finite or oversized gradient.
    metrics.set(f"{prefix}/grad_norm", sum(norms) / len(norms))
    metrics.set(f"{prefix}/grad_norm_max", max(norms))
    metrics.set(f"{prefix}/updates", float(len(parts)))
    metrics.set(f"{prefix}/skipped_updates", float(skipped))
    metrics.set(f"{prefix}/lr", optimizer.param_groups[0]["lr"])


def update_actor(
    actor: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: PackedBatch,
    shard: Shard,
    targets: ActorTargets,
    config: TrainerConfig,
    generator: torch.Generator,
    metrics: Metrics,
    batching: Batching,
    zero_grad: frozenset[int] = frozenset(),
) -> None:
    """PPO-clip updates of the actor (with TIS against the rollout log-probs, and the KL loss
    when configured) over this rank's `shard` of the step's samples (`batch`).

    `zero_grad`: samples whose gradient is exactly zero (advantage 0 on every action token and
    no KL loss). They count in the loss denominators as if trained, but are never forwarded:
    the update is the one training on them would make, without their compute."""
    parts = shard.localize(
        shuffled_parts(
            range(shard.total), config.actor.mini_batches, config.actor.epochs, generator
        )
    )
    if targets.old_logprobs is None and len(parts) > 1 and set(range(batch.size)) - zero_grad:
        raise ValueError("old_logprobs: required when the actor makes more than one update")
    first_pass = len(parts) // config.actor.epochs
    autocast = AUTOCAST[config.autocast]

    def padding(mb: MicroBatch) -> None:
        lp, _ = action_logprobs(actor, mb, config.temperature, autocast=autocast)
        (lp.sum() * 0).backward()

    def backward(mb: MicroBatch, denom: torch.Tensor, index: int) -> None:
        lp, entropy = action_logprobs(
            actor, mb, config.temperature, with_entropy=True, autocast=autocast
        )
        old = lp.detach() if targets.old_logprobs is None else targets.old_logprobs[mb.actions]
        rollout = batch.rollout_logprobs[mb.actions]
        loss, m = policy_loss(
            lp, old, targets.advantages[mb.actions],
            clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip,
            agg=config.loss_agg, cu_seqlens=mb.cu_seqlens, rollout_logprobs=rollout,
            tis_cap=config.tis_cap, denominator=denom,
        )  # fmt: skip
        metrics.add("actor/policy_loss", float(loss.detach()))
        if targets.ref_logprobs is not None:
            ref = targets.ref_logprobs[mb.actions]
            if config.kl_loss_coef > 0:
                kl_loss = kl_penalty(
                    lp, ref, estimator=config.kl_estimator, coef=config.kl_loss_coef,
                    agg=config.loss_agg, cu_seqlens=mb.cu_seqlens, denominator=denom,
                )  # fmt: skip
                metrics.add("actor/kl_loss", float(kl_loss.detach()))
                loss = loss + kl_loss
            kl = kl_per_token(lp.detach(), ref, config.kl_estimator)
            metrics.mean("kl/ref_mean", float(kl.mean()) if kl.numel() else 0.0, kl.numel())
        loss.backward()
        k = lp.numel()
        for name in ("clip_frac", "dual_clip_frac", "approx_kl", "ratio_mean"):
            metrics.mean(f"actor/{name}", m[name], k)
        for name in ("is_weight_mean", "tis_clip_frac"):
            if name in m:
                metrics.mean(f"actor/{name}", m[name], k)
        if entropy is not None and k:
            metrics.mean("actor/entropy", float(entropy.mean()), k)
        if index < first_pass and k:  # the policy before this step's updates
            diff = old - rollout
            metrics.mean("mismatch/logprob_abs_diff", float(diff.abs().mean()), k)
            metrics.mean("mismatch/kl", float(kl_per_token(rollout, old, "k3").mean()), k)

    _update(
        actor, optimizer, scheduler, batch, parts, config, config.loss_agg, backward,
        "actor", metrics, batching, shard, padding, zero_grad,
    )  # fmt: skip


def update_sft(
    actor: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: PackedBatch,
    shard: Shard,
    config: TrainerConfig,
    metrics: Metrics,
    batching: Batching,
) -> None:
    """One supervised update of the actor over this rank's `shard` of the step's samples: the
    negative log-likelihood of the trained tokens (`loss_mask`), averaged over all of them,
    at temperature 1 whatever the sampling temperature."""
    parts = shard.localize([list(range(shard.total))])
    autocast = AUTOCAST[config.autocast]

    def padding(mb: MicroBatch) -> None:
        lp, _ = action_logprobs(actor, mb, 1.0, autocast=autocast)
        (lp.sum() * 0).backward()

    def backward(mb: MicroBatch, denom: torch.Tensor, index: int) -> None:
        lp, entropy = action_logprobs(actor, mb, 1.0, with_entropy=True, autocast=autocast)
        loss = -lp.sum() / denom
        loss.backward()
        metrics.add("actor/sft_loss", float(loss.detach()))
        if entropy is not None and lp.numel():
            metrics.mean("actor/entropy", float(entropy.mean()), lp.numel())

    _update(
        actor, optimizer, scheduler, batch, parts, config, "token_mean", backward,
        "actor", metrics, batching, shard, padding,
    )  # fmt: skip


def update_critic(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: PackedBatch,
    shard: Shard,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    config: TrainerConfig,
    generator: torch.Generator,
    metrics: Metrics,
    batching: Batching,
) -> None:
    """Clipped value-loss updates of the critic toward `returns` `[N]` over this rank's `shard`
    of the step's samples (`batch`)."""
    _critic_updates(
        critic, optimizer, scheduler, batch, shard, config, generator, metrics, batching,
        lambda mb, values: (old_values[mb.actions], returns[mb.actions]),
    )  # fmt: skip


def value_and_update_critic(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: PackedBatch,
    shard: Shard,
    returns_of: Callable[[torch.Tensor], torch.Tensor],
    config: TrainerConfig,
    generator: torch.Generator,
    metrics: Metrics,
    batching: Batching,
) -> torch.Tensor:
    """The critic's one update (one epoch of one mini-batch) that also values the step's
    states, so that no separate no-grad value pass is needed: each sample is forwarded once,
    with gradients, before the update's only optimizer step, so its values are those a
    separate pass would have given. They are the update's old values, and `returns_of(values)`
    `[N] -> [N]` its returns, called per micro-batch with the values of that micro-batch's
    trajectories filled in (the returns must depend only on a trajectory's own values, as
    GAE's do). Returns the values `[N]` (0 off actions) of this rank's samples."""
    if config.critic.epochs != 1 or config.critic.mini_batches != 1:
        raise ValueError(
            "critic: one update (epochs = 1, mini_batches = 1) is needed to value the states "
            "in the update's own forward"
        )
    seen = torch.zeros(batch.token_ids.numel(), dtype=torch.float32, device=batch.token_ids.device)

    def targets(mb: MicroBatch, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old = values.detach()
        seen[mb.actions] = old
        return old, returns_of(seen)[mb.actions]

    _critic_updates(
        critic, optimizer, scheduler, batch, shard, config, generator, metrics, batching, targets
    )
    return seen


def _critic_updates(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: PackedBatch,
    shard: Shard,
    config: TrainerConfig,
    generator: torch.Generator,
    metrics: Metrics,
    batching: Batching,
    targets: Callable[[MicroBatch, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """The critic's updates; `targets(mb, values)`: the old values and returns of `mb`'s
    actions, given the values the update's forward computed."""
    parts = shard.localize(
        shuffled_parts(
            range(shard.total), config.critic.mini_batches, config.critic.epochs, generator
        )
    )

    autocast = AUTOCAST[config.autocast]

    def padding(mb: MicroBatch) -> None:
        (action_values(critic, mb, autocast).sum() * 0).backward()

    def backward(mb: MicroBatch, denom: torch.Tensor, index: int) -> None:
        values = action_values(critic, mb, autocast)
        old, returns = targets(mb, values)
        loss, m = value_loss(values, old, returns, clip=config.value_clip, denominator=denom)
        loss.backward()
        metrics.add("critic/value_loss", float(loss.detach()))
        metrics.mean("critic/value_clip_frac", m["value_clip_frac"], values.numel())

    _update(
        critic, optimizer, scheduler, batch, parts, config, "token_mean", backward,
        "critic", metrics, batching, shard, padding,
    )  # fmt: skip
