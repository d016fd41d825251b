"""A bandit on the `tiny` model: after a fixed prompt, one token sampled at temperature 0.2 from
the actor itself (plain torch, no engine); reward 1 when it lies in a chosen set of ten tokens
(ranks 3 to 12 of the initial distribution, so the mode alone does not win), else 0. PPO and
GRPO must take the probability of the set from about 0.2 to near 1; rewarding the complement
instead must drive it down (the rise comes from the reward, not from the updates as such)."""

from collections.abc import Callable

import pytest
import torch

from tracerl.train.batch import TrainSample
from tracerl.train.trainer import Trainer

PROMPT = [1, 9690, 198, 504]
TEMPERATURE = 0.2
SAMPLES_PER_STEP = 16
STEPS = 20


def policy(trainer: Trainer) -> torch.Tensor:
    with torch.no_grad():
        logits = trainer.actor(torch.tensor([PROMPT])).logits[0, -1].float()
    return torch.softmax(logits / TEMPERATURE, dim=-1)  # [V]


def train_bandit(trainer: Trainer, flip: bool = False) -> tuple[float, float, list[float]]:
    """(initial, final) probability of the rewarded set, and the mean reward of every step."""
    p = policy(trainer)
    chosen = torch.zeros_like(p, dtype=torch.bool)
    chosen[p.argsort(descending=True)[3:13]] = True
    initial = float(p[chosen].sum())
    g = torch.Generator().manual_seed(1)
    rewards = []
    for step in range(STEPS):
        p = policy(trainer)
        tokens = torch.multinomial(p, SAMPLES_PER_STEP, replacement=True, generator=g)
        samples = [
            TrainSample(
                [*PROMPT, int(t)],
                [0, 0, 0, 0, 1],
                [0.0, 0.0, 0.0, 0.0, float(p[t].log())],
                reward=float(bool(chosen[t]) != flip),
                group_id=0,
                weight_version=step,
            )
            for t in tokens
        ]
        rewards.append(trainer.step(samples)["reward/mean"])
    return initial, float(policy(trainer)[chosen].sum()), rewards


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_the_mean_reward_rises_on_a_bandit(
    make_trainer: Callable[..., Trainer], algorithm: str
) -> None:
    trainer = make_trainer(
        algorithm=algorithm, temperature=TEMPERATURE, actor={"lr": 3e-4}, token_budget=256
    )
    initial, final, rewards = train_bandit(trainer)
    assert 0.1 < initial < 0.3
    assert final > 0.9
    assert rewards[0] < 0.4 and sum(rewards[-5:]) / 5 > 0.9


def test_rewarding_the_complement_lowers_the_set(make_trainer: Callable[..., Trainer]) -> None:
    trainer = make_trainer(algorithm="grpo", temperature=TEMPERATURE, actor={"lr": 3e-4})
    initial, final, _ = train_bandit(trainer, flip=True)
    assert final < initial / 4
