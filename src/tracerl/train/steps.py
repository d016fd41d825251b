"""A training step's algorithm over a `Trainer`'s models: `ppo_step` (critic, GAE) and
`group_step` (GRPO, Dr.GRPO, RLOO), and the passes they are made of. `Trainer.step` packs the
batch, picks one and adds the step's shared metrics; the trainer owns the models, optimizers,
memory phases and checkpoints, `tracerl.train.update` the losses and optimizer updates.

A PPO step: reference log-probs (KL configured) -> behaviour log-probs (KL-in-reward with
`recompute`) -> critic values -> token rewards (terminal score, minus beta * KL) -> GAE ->
critic updates -> actor updates (PPO-clip with TIS against the rollout log-probs). With one
critic update (the default) the values come from that update's own forward
(`values_in_update`), else from a no-grad pass first. During `critic_warmup_steps` it stops
after the critic: no actor forward, update or schedule step, and KL-in-reward uses the rollout
log-probs. A group-baseline step takes `group_advantages` for every action token of a
trajectory and updates the actor (optionally with the KL loss). A step trains on every sample
it is given: dropping uniform-reward groups (`filter_uniform_groups`) is the loop's, before a
step, so that the step can wait for signal. Uniform groups it is given are counted; a sample
whose advantage is 0 (without a KL loss) counts in the loss denominators but is never
forwarded, since its gradient is exactly zero, and a batch with no signal still steps the
optimizer (AdamW's momentum), as training on it would.

Under a process group every rank is given the same whole batch and trains on its shard of it;
every decision that changes which passes run is taken from the whole batch, so that all ranks
make the same collectives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from tracerl.algo.advantages import gae, group_advantages, uniform_groups, whiten
from tracerl.train import lora
from tracerl.train.batch import MicroBatch, PackedBatch, TrainSample
from tracerl.train.forward import all_logprobs, all_values
from tracerl.train.phases import Phase
from tracerl.train.shard import Shard, reshard
from tracerl.train.update import (
    ActorTargets,
    Metrics,
    critic_metrics,
    ppo_rewards,
    token_stats,
    update_actor,
    update_critic,
    value_and_update_critic,
)

if TYPE_CHECKING:
    from tracerl.train.trainer import Trainer


def ppo_step(
    trainer: Trainer,
    batch: PackedBatch,
    shard: Shard,
    metrics: Metrics,
    generator: torch.Generator,
    uniform_rewards: bool,
) -> list[int]:
    """One PPO step; `uniform_rewards`: every episode of the whole batch has the same
    reward (its advantages are whitened only with `whiten_uniform_batches`, and are 0
    with `zero_uniform_batches`)."""
    cfg = trainer.config
    assert trainer.critic is not None and trainer.critic_optimizer is not None
    samples = list(range(batch.size))
    mbs = trainer.micro_batches(batch, samples)
    mask, cu = batch.loss_mask, batch.cu_seqlens
    warmup = trainer.step_count < cfg.critic_warmup_steps
    ref = reference_logprobs(trainer, batch, shard, mbs, metrics)
    old: torch.Tensor | None = None
    # One no-grad actor pass, before the critic phase, serves KL-in-reward and the old
    # log-probs of several actor updates.
    recompute = cfg.kl_reward_coef > 0 and cfg.kl_behavior_logprobs == "recompute"
    # the same on every rank: the whole batch's rewards and the config decide it
    zeroed = uniform_rewards and cfg.zero_uniform_batches and cfg.kl_reward_coef == 0
    forwarded = not zeroed or cfg.kl_loss_coef > 0  # a KL loss has a gradient of its own
    if not warmup and forwarded and (recompute or actor_updates(trainer, shard.total) > 1):
        old = behaviour_logprobs(trainer, batch, shard, mbs, metrics)
    # KL-in-reward's behaviour log-probs: recomputed unless configured otherwise; critic
    # warmup has no actor pass
    behaviour = old if recompute and old is not None else batch.rollout_logprobs
    rewards = ppo_rewards(batch, cfg, behaviour, ref, metrics)

    def estimate(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gae(values, rewards, mask, cu, cfg.gamma, cfg.lam)  # advantages, returns

    with trainer.phase(Phase.CRITIC, "critic", metrics):
        trainer.phases.require("critic")
        if values_in_update(trainer):
            values = value_and_update_critic(
                trainer.critic, trainer.critic_optimizer, trainer.critic_scheduler, batch, shard,
                lambda v: estimate(v)[1], cfg, generator, metrics, trainer.batching,
            )  # fmt: skip
            advantages, returns = estimate(values)
        else:
            values = all_values(
                trainer.critic, mbs, batch.token_ids.numel(), trainer.device,
                shard.padding(mbs, trainer.device, trainer.batching), trainer.autocast,
            )  # fmt: skip
            reshard(trainer.critic)
            advantages, returns = estimate(values)
            with trainer.adapter_dropout(trainer.critic):
                update_critic(
                    trainer.critic, trainer.critic_optimizer, trainer.critic_scheduler, batch,
                    shard, values, returns, cfg, generator, metrics, trainer.batching,
                )  # fmt: skip
        critic_metrics(values, returns, mask, metrics)
    if warmup:
        metrics.set("critic/warmup", 1.0)
        return samples
    metrics.set("adv/zeroed", float(zeroed))
    if zeroed:  # the update on advantage 0: the optimizer's step on a zero gradient
        advantages = torch.zeros_like(advantages)
        no_grad = frozenset() if forwarded else frozenset(samples)
        train_actor(
            trainer, batch, shard, forwarded, mbs, advantages, old, ref, metrics, generator, no_grad
        )
        return samples
    whitened = cfg.whiten_advantages and (cfg.whiten_uniform_batches or not uniform_rewards)
    if whitened:
        advantages = whiten(advantages, mask)
    metrics.set("adv/whitened", float(whitened))
    for key, value in token_stats(advantages, mask).items():
        metrics.set(f"adv/{key}", value)
    train_actor(trainer, batch, shard, True, mbs, advantages, old, ref, metrics, generator)
    return samples


def group_step(
    trainer: Trainer,
    batch: PackedBatch,
    shard: Shard,
    whole: Sequence[TrainSample],
    metrics: Metrics,
    generator: torch.Generator,
) -> list[int]:
    """Baselines come from the whole batch (`whole`), which every rank holds; each rank
    trains on its shard of it."""
    cfg = trainer.config
    rewards = torch.tensor([s.reward for s in whole], dtype=torch.float32)
    group_ids = torch.tensor([s.group_id for s in whole], dtype=torch.int64)
    uniform = uniform_groups(rewards, group_ids)
    metrics.set("groups/count", float(torch.unique(group_ids).numel()))
    metrics.set("groups/uniform", float(torch.unique(group_ids[uniform]).numel()))
    method = cfg.algorithm
    assert method != "ppo"  # a group baseline, narrowed for the type checker
    whole_advantages = group_advantages(
        rewards, group_ids, method, std_normalize=cfg.std_normalize
    ).tolist()
    # Without a KL loss, a sample whose advantage is 0 has exactly zero gradient: it stays
    # in the denominators (so the update equals training on it) but is never forwarded.
    zero = [cfg.kl_loss_coef == 0 and a == 0.0 for a in whole_advantages]
    metrics.set("actor/zero_grad_samples", float(sum(zero)))
    per_sample = torch.tensor(
        [whole_advantages[g] for g in shard.owned], dtype=torch.float32, device=trainer.device
    )
    lengths = torch.tensor(batch.lengths, device=trainer.device)
    advantages = torch.repeat_interleave(per_sample, lengths) * batch.loss_mask
    zero_grad = frozenset(i for i, g in enumerate(shard.owned) if zero[g])
    computed = [i for i in range(batch.size) if i not in zero_grad]
    for key, value in token_stats(advantages, batch.loss_mask).items():
        metrics.set(f"adv/{key}", value)
    mbs = trainer.micro_batches(batch, computed) if computed else []
    ref = reference_logprobs(trainer, batch, shard, mbs, metrics)
    train_actor(
        trainer, batch, shard, not all(zero), mbs, advantages, None, ref, metrics, generator,
        zero_grad,
    )  # fmt: skip
    return computed


def values_in_update(trainer: Trainer) -> bool:
    """Whether the critic's update forward also gives the step's values (one update, and
    no LoRA dropout, whose values would differ from a no-grad pass's), instead of a
    separate no-grad value pass before it."""
    one_update = trainer.config.critic.epochs == 1 and trainer.config.critic.mini_batches == 1
    dropout = trainer.lora is not None and trainer.lora.dropout > 0
    return trainer.fuse_value_pass and one_update and not dropout


def reference_logprobs(
    trainer: Trainer, batch: PackedBatch, shard: Shard, mbs: list[MicroBatch], metrics: Metrics
) -> torch.Tensor | None:
    """The reference model's log-probs of the batch (None without a KL); with LoRA, the
    actor's with its adapters off."""
    if not trainer.config.uses_reference:
        return None
    if trainer.reference is None:
        with (
            trainer.phase(Phase.BEHAVIOUR, "reference", metrics),
            lora.adapters_disabled(trainer.actor),
        ):
            trainer.phases.require("actor")
            return _logprobs(trainer, trainer.actor, batch, shard, mbs)
    with trainer.phase(Phase.REFERENCE, "reference", metrics):
        trainer.phases.require("reference")
        return _logprobs(trainer, trainer.reference, batch, shard, mbs)


def behaviour_logprobs(
    trainer: Trainer, batch: PackedBatch, shard: Shard, mbs: list[MicroBatch], metrics: Metrics
) -> torch.Tensor:
    """The actor's log-probs of the batch before any update (no grad)."""
    with trainer.phase(Phase.BEHAVIOUR, "behaviour", metrics):
        trainer.phases.require("actor")
        return _logprobs(trainer, trainer.actor, batch, shard, mbs)


def _logprobs(
    trainer: Trainer,
    model: torch.nn.Module,
    batch: PackedBatch,
    shard: Shard,
    mbs: list[MicroBatch],
) -> torch.Tensor:
    out = all_logprobs(
        model, mbs, batch.token_ids.numel(), trainer.config.temperature, trainer.device,
        shard.padding(mbs, trainer.device, trainer.batching), trainer.autocast,
    )  # fmt: skip
    reshard(model)
    return out


def actor_updates(trainer: Trainer, samples: int) -> int:
    optim = trainer.config.actor
    return optim.epochs * min(optim.mini_batches, samples)


def train_actor(
    trainer: Trainer,
    batch: PackedBatch,
    shard: Shard,
    forwarded: bool,
    mbs: list[MicroBatch],
    advantages: torch.Tensor,
    old: torch.Tensor | None,
    ref: torch.Tensor | None,
    metrics: Metrics,
    generator: torch.Generator,
    zero_grad: frozenset[int] = frozenset(),
) -> None:
    """`forwarded`: some rank forwards a sample (not all are zero-gradient), decided from
    the whole batch so that every rank makes the same passes."""
    if old is None and forwarded and actor_updates(trainer, shard.total) > 1:
        old = behaviour_logprobs(trainer, batch, shard, mbs, metrics)
    with trainer.phase(Phase.ACTOR, "actor", metrics):
        trainer.phases.require("actor")
        with trainer.adapter_dropout(trainer.actor):
            update_actor(
                trainer.actor, trainer.actor_optimizer, trainer.actor_scheduler, batch, shard,
                ActorTargets(advantages, old, ref if trainer.config.kl_loss_coef > 0 else None),
                trainer.config, generator, metrics, trainer.batching, zero_grad,
            )  # fmt: skip
