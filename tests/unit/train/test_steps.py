import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.conftest import reference_logprobs
from tracerl.train import steps
from tracerl.train.batch import TrainSample
from tracerl.train.trainer import Trainer

from .conftest import ACTION_MIN_ID, make_samples

MakeTrainer = Callable[..., Trainer]


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def changed(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> set[str]:
    return {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}


def count_forwards(model: torch.nn.Module) -> list[int]:
    calls = [0]
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_a_ppo_step_trains_actor_and_critic(make_trainer: MakeTrainer) -> None:
    trainer = make_trainer(algorithm="ppo", actor={"mini_batches": 2}, critic={"epochs": 2})
    assert trainer.critic is not None
    actor_before, critic_before = snapshot(trainer.actor), snapshot(trainer.critic)
    metrics = trainer.step(make_samples(0, count=6))
    for key in (
        "actor/policy_loss", "critic/value_loss", "actor/clip_frac", "critic/value_clip_frac",
        "actor/approx_kl", "actor/entropy", "critic/explained_variance", "critic/value_mean",
        "critic/return_mean", "adv/mean", "adv/std", "adv/min", "adv/max", "actor/grad_norm",
        "critic/grad_norm", "actor/skipped_updates", "actor/lr", "critic/lr",
        "perf/tokens_per_s", "time/critic", "time/actor", "time/behaviour",
        "mismatch/logprob_abs_diff", "mismatch/kl",
    ):  # fmt: skip
        assert math.isfinite(metrics[key]), key
    assert metrics["actor/updates"] == 2 and metrics["critic/updates"] == 2
    assert metrics["actor/skipped_updates"] == 0 and metrics["critic/skipped_updates"] == 0
    assert metrics["adv/mean"] == pytest.approx(0.0, abs=1e-6)  # whitened
    assert metrics["adv/std"] == pytest.approx(1.0, rel=0.1)
    assert changed(trainer.actor, actor_before) == set(actor_before)  # every tensor moved
    assert changed(trainer.critic, critic_before) == set(critic_before)
    assert trainer.step_count == 1 and trainer.actor_scheduler.last_epoch == 2
    assert trainer.phases.phase.name == "IDLE"


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "rloo"])
def test_a_group_baseline_step_trains_the_actor_with_a_kl_loss(
    make_trainer: MakeTrainer, algorithm: str
) -> None:
    trainer = make_trainer(algorithm=algorithm, kl_loss_coef=0.05)
    assert trainer.critic is None and trainer.reference is not None
    before = snapshot(trainer.actor)
    samples = make_samples(0, count=6)
    first = trainer.step(samples)
    assert math.isfinite(first["actor/policy_loss"]) and math.isfinite(first["actor/kl_loss"])
    assert first["kl/ref_mean"] == 0.0  # the actor is still the reference: bit for bit
    assert changed(trainer.actor, before) == set(before)
    assert first["groups/count"] == 3 and first["groups/uniform"] == 0
    second = trainer.step(samples)
    assert second["kl/ref_mean"] > 0 and second["actor/kl_loss"] > 0
    assert "critic/value_loss" not in second


def record_training_forwards(
    model: torch.nn.Module, last_norm: torch.nn.Module
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """(input ids, [gradient at the last hidden state]) of every forward that builds a graph."""
    seen: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
    pending: list[torch.Tensor] = []

    def keep_input(module: Any, args: Any, kwargs: Any) -> None:
        pending[:] = [kwargs["input_ids"] if "input_ids" in kwargs else args[0]]

    def keep_grad(module: Any, args: Any, output: torch.Tensor) -> None:
        if output.requires_grad:
            grads: list[torch.Tensor] = []
            output.register_hook(lambda g: grads.append(g.detach()))
            seen.append((pending[0], grads))

    model.register_forward_pre_hook(keep_input, with_kwargs=True)
    last_norm.register_forward_hook(keep_grad)
    return seen


@pytest.mark.parametrize("batching", ["pack", "bucket", "pad"])
def test_masked_tokens_get_zero_gradient(make_trainer: MakeTrainer, batching: str) -> None:
    """The gradient reaching the last hidden state at position t is zero unless token t + 1 is
    an action, for the actor and the critic (an off-by-one or a leaked mask would show)."""
    trainer = make_trainer(algorithm="ppo", batching=batching, token_budget=40)
    assert trainer.critic is not None
    actor = record_training_forwards(trainer.actor, trainer.actor.model.norm)
    critic = record_training_forwards(trainer.critic, trainer.critic.model.norm)
    trainer.step(make_samples(5, count=6))
    assert len(actor) >= 2 and len(critic) >= 2  # several micro-batches each
    for ids, grads in actor + critic:
        (grad,) = grads
        next_is_action = torch.zeros_like(ids, dtype=torch.bool)
        next_is_action[:, :-1] = ids[:, 1:] >= ACTION_MIN_ID
        per_position = grad.abs().sum(-1)  # [R, L]
        assert bool((per_position[~next_is_action] == 0).all())
        assert bool((per_position[next_is_action] > 0).all())


def test_critic_warmup_leaves_the_actor_bit_identical(make_trainer: MakeTrainer) -> None:
    # with KL-in-reward recomputing behaviour log-probs: a warmup step must not run the actor,
    # and the second warmup step must not trip over the first one's phase (the seed's crash)
    trainer = make_trainer(algorithm="ppo", critic_warmup_steps=2, kl_reward_coef=0.1)
    assert trainer.critic is not None
    actor_forwards = count_forwards(trainer.actor)
    actor_before, critic_before = snapshot(trainer.actor), snapshot(trainer.critic)
    samples = make_samples(1, count=4)
    for _ in range(2):
        metrics = trainer.step(samples)
        assert metrics["critic/warmup"] == 1.0 and "actor/policy_loss" not in metrics
    assert actor_forwards[0] == 0
    assert changed(trainer.actor, actor_before) == set()
    assert trainer.actor_optimizer.state_dict()["state"] == {}
    assert trainer.actor_scheduler.last_epoch == 0
    assert changed(trainer.critic, critic_before) == set(critic_before)
    metrics = trainer.step(samples)
    assert "critic/warmup" not in metrics and actor_forwards[0] > 0
    assert changed(trainer.actor, actor_before) == set(actor_before)
    assert trainer.actor_scheduler.last_epoch == 1


def count_tokens(model: torch.nn.Module) -> list[int]:
    """Tokens each forward of `model` processes (padding excluded), one entry per call."""
    tokens: list[int] = []

    def hook(module: Any, args: Any, kwargs: Any) -> None:
        mask = kwargs.get("attention_mask")
        tokens.append(int(mask.sum()) if mask is not None else kwargs["input_ids"].numel())

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return tokens


def with_rewards(samples: list[TrainSample], rewards: list[float]) -> list[TrainSample]:
    return [
        TrainSample(s.token_ids, s.loss_mask, s.logprobs, r, s.group_id)
        for s, r in zip(samples, rewards, strict=True)
    ]


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_kept_uniform_groups_cost_no_compute_and_change_nothing(
    make_trainer: MakeTrainer, mini_batches: int
) -> None:
    """Samples with advantage 0 are never forwarded, yet the step equals the one that trains on
    them: the same denominators, the same (zero) gradients, the same optimizer step."""
    base = make_samples(3, count=6)
    samples = with_rewards(base, [1.0, 1.0, 0.0, 1.0, 0.0, 0.0])  # groups 0 and 2 are uniform
    actor = {"mini_batches": mini_batches, "max_grad_norm": None}  # clipping hides scale
    # SGD, not AdamW: Adam's normalisation turns float-rounding differences of the two layouts
    # in near-zero gradient entries into lr-sized steps; SGD keeps them rounding-sized.
    skipping = make_trainer(algorithm="grpo", actor=actor)
    skipping.actor_optimizer = torch.optim.SGD(skipping.actor.parameters(), lr=10.0)
    initial = snapshot(skipping.actor)
    tokens = count_tokens(skipping.actor)
    metrics = skipping.step(samples)
    assert metrics["groups/uniform"] == 2 and metrics["actor/zero_grad_samples"] == 4
    assert metrics["perf/tokens"] == len(samples[2].token_ids) + len(samples[3].token_ids)
    # every forward saw only the informative group (mini-batches: plus the old-log-prob pass)
    assert sum(tokens) == (2 if mini_batches > 1 else 1) * int(metrics["perf/tokens"])

    # The reference: the same step with every sample forwarded, through the update itself.
    from tracerl.train.batch import PackedBatch
    from tracerl.train.shard import Shard
    from tracerl.train.update import ActorTargets, Metrics, update_actor

    full = make_trainer(algorithm="grpo", actor=actor)
    full.actor_optimizer = torch.optim.SGD(full.actor.parameters(), lr=10.0)
    batch = PackedBatch.build(samples, torch.device("cpu"))
    advantages = torch.zeros_like(batch.loss_mask)
    group = batch.token_index([2, 3])
    advantages[group] = skipping_advantages(batch)[group]
    old = None
    if mini_batches > 1:
        from tracerl.train.forward import all_logprobs

        mbs = full.micro_batches(batch, list(range(6)))
        old = all_logprobs(full.actor, mbs, batch.token_ids.numel(), 1.0, torch.device("cpu"))
    generator = torch.Generator().manual_seed(full.config.seed * 1_000_003)
    update_actor(
        full.actor, full.actor_optimizer, None, batch, Shard.whole(6),
        ActorTargets(advantages, old, None), full.config, generator, Metrics(), full.batching,
    )  # fmt: skip
    moved = 0
    for (name, a), (_, b) in zip(
        skipping.actor.named_parameters(), full.actor.named_parameters(), strict=True
    ):  # the steps (a large lr makes them large next to float rounding), compared
        torch.testing.assert_close(a - initial[name], b - initial[name], msg=name)
        moved += int(not torch.equal(a, initial[name]))
    assert moved > 0


def skipping_advantages(batch: Any) -> torch.Tensor:
    """GRPO advantages per token of `batch` (what the trainer computes)."""
    from tracerl.algo.advantages import group_advantages

    per_sample = group_advantages(batch.rewards, batch.group_ids, "grpo", std_normalize=True)
    lengths = torch.tensor(batch.lengths)
    return torch.repeat_interleave(per_sample.float(), lengths) * batch.loss_mask


def test_a_step_with_no_signal_still_steps_the_optimizer(make_trainer: MakeTrainer) -> None:
    """Kept uniform groups: a batch without signal forwards nothing, but the optimizer steps
    as training on it would (AdamW's momentum carries the last signal on)."""
    trainer = make_trainer(algorithm="grpo")
    tokens = count_tokens(trainer.actor)
    base = make_samples(3, count=6)
    trainer.step(base)  # rewards differ within every group
    tokens.clear()
    before = snapshot(trainer.actor)
    metrics = trainer.step(with_rewards(base, [1.0] * 6))
    assert tokens == [] and metrics["actor/updates"] == 1 and metrics["perf/tokens"] == 0
    assert changed(trainer.actor, before)  # momentum moved the weights
    assert trainer.actor_scheduler.last_epoch == 2 and trainer.step_count == 2


@pytest.mark.parametrize("whiten_uniform", [False, True])
def test_a_ppo_batch_with_one_reward_is_not_whitened_unless_asked(
    make_trainer: MakeTrainer, whiten_uniform: bool
) -> None:
    """A batch whose episodes all scored the same has advantages from the critic's errors
    alone: whitening them would scale noise to a full-size update, so by default they train as
    they are; `whiten_uniform_batches` whitens them too, and a batch with different rewards is
    always whitened."""
    trainer = make_trainer(algorithm="ppo", whiten_uniform_batches=whiten_uniform)
    base = make_samples(3, count=6)
    varied = trainer.step(base)
    assert varied["adv/whitened"] == 1.0 and varied["adv/std"] == pytest.approx(1.0, rel=0.1)
    same = trainer.step(with_rewards(base, [0.0] * 6))
    assert same["adv/whitened"] == float(whiten_uniform)
    if whiten_uniform:
        assert same["adv/std"] == pytest.approx(1.0, rel=0.1)
    else:  # the critic's errors at their own scale: the values of a fresh head are small
        assert 0.0 < same["adv/std"] < 0.5
    # and without whitening at all, neither is
    plain = make_trainer(algorithm="ppo", whiten_advantages=False).step(base)
    assert plain["adv/whitened"] == 0.0


def test_kl_in_reward_shapes_the_value_targets_and_kl_loss_does_not(
    make_trainer: MakeTrainer, tiny: tuple[Any, Any]
) -> None:
    """gamma = lam = 1: the return at action i of n is the score minus beta * KL summed over
    actions i..n-1. With rollout log-probs = reference + 0.5 and the k1 estimator, each
    action's KL is 0.5, so beta = 0.2 shifts that return by -0.1 * (n - i)."""
    model, _ = tiny
    temperature, beta = 0.7, 0.2
    shapes = [(4, 4), (3, 2), (6, 5)]
    samples = []
    for i, (p, c) in enumerate(shapes):
        prompt, completion = list(range(20 + i, 20 + i + p)), list(range(3000 + i, 3000 + i + c))
        lp = (reference_logprobs(model, prompt, completion, temperature) + 0.5).tolist()
        samples.append(
            TrainSample(prompt + completion, [0] * p + [1] * c, [0.0] * p + lp, 1.0 + i, i)
        )
    common: dict[str, Any] = {
        "algorithm": "ppo", "gamma": 1.0, "lam": 1.0, "temperature": temperature,
        "kl_estimator": "k1", "kl_behavior_logprobs": "rollout", "critic_warmup_steps": 1,
    }  # fmt: skip
    shaped = make_trainer(kl_reward_coef=beta, **common).step(samples)
    returns = [1.0 + i - beta * 0.5 * (c - j) for i, (_, c) in enumerate(shapes) for j in range(c)]
    assert shaped["critic/return_mean"] == pytest.approx(sum(returns) / len(returns), rel=1e-5)
    assert shaped["kl/ref_mean"] == pytest.approx(0.5, rel=1e-4)
    plain = make_trainer(kl_loss_coef=beta, **common).step(samples)
    scores = [1.0 + i for i, (_, c) in enumerate(shapes) for _ in range(c)]
    assert plain["critic/return_mean"] == pytest.approx(sum(scores) / len(scores), rel=1e-6)


@pytest.mark.parametrize("mini_batches", [1, 3])
def test_rollout_behaviour_logprobs_are_used_however_many_actor_updates(
    make_trainer: MakeTrainer, tiny: tuple[Any, Any], mini_batches: int
) -> None:
    """`kl_behavior_logprobs = "rollout"` after critic warmup, also when several actor updates
    make the step compute old log-probs (which are the reference's here: KL 0 if used)."""
    model, _ = tiny
    samples = []
    for i, (p, c) in enumerate([(4, 4), (3, 2), (6, 5)]):
        prompt, completion = list(range(20 + i, 20 + i + p)), list(range(3000 + i, 3000 + i + c))
        lp = (reference_logprobs(model, prompt, completion, 1.0) + 0.5).tolist()
        samples.append(
            TrainSample(prompt + completion, [0] * p + [1] * c, [0.0] * p + lp, 1.0 + i, i)
        )
    trainer = make_trainer(
        algorithm="ppo", kl_estimator="k1", kl_behavior_logprobs="rollout", kl_reward_coef=0.2,
        actor={"lr": 1e-3, "mini_batches": mini_batches},
    )  # fmt: skip
    metrics = trainer.step(samples)
    assert metrics["actor/updates"] == mini_batches
    assert metrics["kl/ref_mean"] == pytest.approx(0.5, rel=1e-4)


def test_rollout_logprobs_from_the_same_policy_show_no_mismatch(
    make_trainer: MakeTrainer, tiny: tuple[Any, Any]
) -> None:
    model, _ = tiny
    samples = []
    for i, (p, c) in enumerate([(3, 5), (6, 2), (2, 7)]):
        prompt, completion = list(range(40 + i, 40 + i + p)), list(range(5000 + i, 5000 + i + c))
        lp = reference_logprobs(model, prompt, completion, 0.8).tolist()
        samples.append(
            TrainSample(prompt + completion, [0] * p + [1] * c, [0.0] * p + lp, float(i), 0)
        )
    metrics = make_trainer(algorithm="grpo", temperature=0.8).step(samples)
    assert metrics["mismatch/logprob_abs_diff"] < 1e-5
    assert metrics["actor/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["actor/ratio_mean"] == 1.0  # one update: old log-probs are its own forward


def linear_output_dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    """The dtypes the model's linear layers produce from now on."""
    seen: set[torch.dtype] = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    return seen


def sampled_by(model: Any) -> list[TrainSample]:
    """Two groups of two trajectories whose rollout log-probs are `model`'s own (float32)."""
    samples = []
    for i, (p, c) in enumerate([(3, 5), (6, 2), (2, 7), (4, 4)]):
        prompt, completion = list(range(40 + i, 40 + i + p)), list(range(5000 + i, 5000 + i + c))
        lp = reference_logprobs(model, prompt, completion, 1.0).tolist()
        ids, mask = prompt + completion, [0] * p + [1] * c
        samples.append(TrainSample(ids, mask, [0.0] * p + lp, float(i % 2), i // 2))
    return samples


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_autocast_multiplies_in_bfloat16_and_keeps_everything_else_float32(
    make_trainer: MakeTrainer, tiny: tuple[Any, Any], algorithm: str
) -> None:
    samples = sampled_by(tiny[0])
    plain = make_trainer(algorithm=algorithm, kl_loss_coef=0.05)
    mixed = make_trainer(algorithm=algorithm, kl_loss_coef=0.05, autocast="bfloat16")
    models = [m for m in (mixed.actor, mixed.critic, mixed.reference) if m is not None]
    assert len(models) == (3 if algorithm == "ppo" else 2)
    seen = [linear_output_dtypes(m) for m in models]
    plain_seen = linear_output_dtypes(plain.actor)
    before = snapshot(mixed.actor)
    want, got = plain.step(samples), mixed.step(samples)
    assert plain_seen == {torch.float32}
    assert seen == [{torch.bfloat16}] * len(models)  # actor, critic (ppo), reference
    for model in models:  # weights and optimizer state stay float32
        assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert changed(mixed.actor, before) == set(before)
    state = mixed.actor_optimizer.state_dict()["state"]
    assert {t.dtype for s in state.values() for t in s.values() if t.dim()} == {torch.float32}
    # against the float32 rollout: exact in float32, bfloat16's rounding under autocast
    assert want["mismatch/logprob_abs_diff"] < 1e-5
    assert 1e-4 < got["mismatch/logprob_abs_diff"] < 0.1
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=0.2)
    # the weight probe scores in float32 whatever the step's precision
    seen[0].clear()
    ids = list(range(40, 60))
    probed = torch.tensor(mixed.probe_logprobs(ids, 12))
    assert seen[0] == {torch.float32}
    assert torch.allclose(probed, reference_logprobs(mixed.actor, ids[:12], ids[12:], 1.0))


@pytest.mark.parametrize(
    "overrides",
    [{}, {"kl_reward_coef": 0.1, "lam": 0.8, "gamma": 0.9, "value_clip": 0.05}],
    ids=["defaults", "kl_in_reward_and_discounting"],
)
def test_one_critic_update_values_the_states_in_its_own_forward(
    make_trainer: MakeTrainer, overrides: dict[str, Any]
) -> None:
    """With one critic update the critic runs no separate value pass, and the step is the
    one that pass gives: the same values, returns, losses and weights."""
    fused = make_trainer(algorithm="ppo", token_budget=40, **overrides)
    separate = make_trainer(algorithm="ppo", token_budget=40, **overrides)
    separate.fuse_value_pass = False
    assert steps.values_in_update(fused) and not steps.values_in_update(separate)
    assert fused.critic is not None and separate.critic is not None
    calls = {"fused": count_forwards(fused.critic), "separate": count_forwards(separate.critic)}
    before = {"actor": snapshot(fused.actor), "critic": snapshot(fused.critic)}
    samples = make_samples(5, count=6)
    for _ in range(3):  # later steps start from weights the first updates moved
        got, want = fused.step(samples), separate.step(samples)
        for key in (
            "critic/value_mean", "critic/return_mean", "critic/value_loss",
            "critic/explained_variance", "critic/value_clip_frac", "adv/mean", "adv/std",
            "actor/policy_loss", "critic/grad_norm", "actor/grad_norm",
        ):  # fmt: skip
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert calls["separate"][0] == 2 * calls["fused"][0] > 0  # one forward per micro-batch
    for name in ("actor", "critic"):
        # the weights moved the same way, up to float rounding (which Adam's normalised steps
        # can enlarge on a component whose gradient is near zero: compared over the model)
        moved = [
            torch.cat([(m.state_dict()[k] - v).flatten() for k, v in before[name].items()])
            for m in (getattr(fused, name), getattr(separate, name))
        ]
        assert float((moved[0] - moved[1]).norm() / moved[1].norm()) < 1e-3, name


def test_several_critic_updates_value_the_states_before_the_first(
    make_trainer: MakeTrainer,
) -> None:
    trainer = make_trainer(algorithm="ppo", critic={"epochs": 2})
    assert not steps.values_in_update(trainer)
    trainer = make_trainer(algorithm="ppo", critic={"mini_batches": 2})
    assert not steps.values_in_update(trainer)


@pytest.mark.parametrize(
    "overrides, actor_forwards",
    [
        ({"zero_uniform_batches": True}, False),
        ({"zero_uniform_batches": True, "kl_loss_coef": 0.1}, True),  # the KL loss's gradient
        ({"zero_uniform_batches": False}, True),
    ],
    ids=["zeroed", "zeroed_with_a_kl_loss", "default"],
)
def test_a_ppo_batch_with_one_reward_gets_advantage_0_when_asked(
    make_trainer: MakeTrainer, overrides: dict[str, Any], actor_forwards: bool
) -> None:
    """`zero_uniform_batches`: a batch whose episodes all scored the same trains the critic,
    and the actor's update is the optimizer's step on a zero gradient (momentum carries on),
    with no actor forward unless a KL loss needs one."""
    trainer = make_trainer(algorithm="ppo", actor={"mini_batches": 2}, **overrides)
    assert trainer.critic is not None
    actor_tokens, critic_tokens = count_tokens(trainer.actor), count_tokens(trainer.critic)
    base = make_samples(3, count=6)
    varied = trainer.step(base)
    assert varied["adv/zeroed"] == 0.0 and actor_tokens
    actor_tokens.clear(), critic_tokens.clear()
    actor_before, critic_before = snapshot(trainer.actor), snapshot(trainer.critic)
    same = trainer.step(with_rewards(base, [1.0] * 6))
    assert same["adv/zeroed"] == float(overrides["zero_uniform_batches"])
    assert bool(actor_tokens) == actor_forwards and critic_tokens
    assert changed(trainer.critic, critic_before) == set(critic_before)
    assert changed(trainer.actor, actor_before)  # at least momentum moved it
    assert same["actor/updates"] == 2 and trainer.actor_scheduler.last_epoch == 4


def test_kl_in_reward_keeps_a_one_reward_batchs_advantages(make_trainer: MakeTrainer) -> None:
    """With KL-in-reward the per-token rewards differ even where the scores do not."""
    trainer = make_trainer(algorithm="ppo", zero_uniform_batches=True, kl_reward_coef=0.1)
    metrics = trainer.step(with_rewards(make_samples(3, count=6), [1.0] * 6))
    assert metrics["adv/zeroed"] == 0.0 and metrics["adv/std"] > 0
