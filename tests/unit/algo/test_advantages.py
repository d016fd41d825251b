import math

import pytest
import torch

from tests.unit.algo.references import gae_ref, group_ref, random_pack, terminal_ref
from tracerl.algo.advantages import (
    gae,
    group_advantages,
    terminal_rewards,
    uniform_groups,
    whiten,
)
from tracerl.algo.losses import kl_in_reward

SETTINGS = [
    (1.0, 1.0),
    (1.0, 0.95),
    (0.99, 0.9),
    (0.0, 0.5),
    (0.5, 0.0),
    (0.0, 0.0),
    (1.0, 0.0),
    (0.3, 1.0),
]


def test_gae_hand_example() -> None:
    # tokens: prompt a1 a2 obs a3 | mask 0 1 1 0 1 | V(a1, a2, a3) = 1.0, 0.5, 0.25; reward 1 on a3
    # gamma = lam = 1: delta3 = 1 - 0.25 = 0.75, delta2 = 0.25 - 0.5 = -0.25,
    # delta1 = 0.5 - 1.0 = -0.5; A3 = 0.75, A2 = -0.25 + 0.75 = 0.5, A1 = -0.5 + 0.5 = 0.0.
    # Returns A + V are 1.0 everywhere: the undiscounted future reward.
    values = torch.tensor([9.0, 1.0, 0.5, 9.0, 0.25])
    rewards = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0])
    mask = torch.tensor([0, 1, 1, 0, 1])
    adv, ret = gae(values, rewards, mask, torch.tensor([0, 5]), gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, 0.5, 0.0, 0.75]))
    torch.testing.assert_close(ret, torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0]))


@pytest.mark.parametrize(("gamma", "lam"), SETTINGS)
def test_gae_matches_the_per_token_reference(gamma: float, lam: float) -> None:
    gen = torch.Generator().manual_seed(int(gamma * 100 + lam * 10))
    for _ in range(40):
        cu, mask = random_pack(gen)
        values = torch.randn(mask.numel(), generator=gen)
        rewards = torch.randn(mask.numel(), generator=gen) * mask
        adv, ret = gae(values, rewards, mask, cu, gamma, lam)
        ref_adv, ref_ret = gae_ref(values, rewards, mask, cu, gamma, lam)
        torch.testing.assert_close(adv, ref_adv.float())
        torch.testing.assert_close(ret, ref_ret.float())


def test_gae_one_token_trajectories_and_bfloat16() -> None:
    gen = torch.Generator().manual_seed(3)
    cu = torch.arange(0, 9)  # eight one-token trajectories
    mask = torch.tensor([1, 0, 1, 1, 0, 1, 1, 1])
    values = torch.randn(8, generator=gen).bfloat16()
    rewards = (torch.randn(8, generator=gen) * mask).bfloat16()
    adv, ret = gae(values, rewards, mask, cu, 1.0, 0.95)
    assert adv.dtype == torch.bfloat16
    ref_adv, ref_ret = gae_ref(values.float(), rewards.float(), mask, cu, 1.0, 0.95)
    torch.testing.assert_close(adv, ref_adv.bfloat16())
    torch.testing.assert_close(ret, ref_ret.bfloat16())


def test_gae_stays_exact_on_long_trajectories() -> None:
    # 60k actions in one trajectory: a global (gamma * lam) ** t weighting underflows here.
    gen = torch.Generator().manual_seed(4)
    t = 100_000
    mask = (torch.rand(t, generator=gen) < 0.6).long()
    values = torch.randn(t, generator=gen) * 0.1
    rewards = torch.randn(t, generator=gen) * 0.01 * mask
    for gamma, lam in ((1.0, 1.0), (0.999, 0.99)):
        adv, _ = gae(values, rewards, mask, torch.tensor([0, t]), gamma, lam)
        ref, _ = gae_ref(values, rewards, mask, torch.tensor([0, t]), gamma, lam)
        torch.testing.assert_close(adv, ref.float())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cu_seqlens": torch.tensor([1, 4])}, "cu_seqlens: must start at 0"),
        ({"cu_seqlens": torch.tensor([0, 3])}, "cu_seqlens: must start at 0 and end at T=4"),
        ({"cu_seqlens": torch.tensor([0, 2, 2, 4])}, "strictly increasing"),
        ({"cu_seqlens": torch.tensor([0.0, 4.0])}, "cu_seqlens: expected a 1-d int64"),
        ({"gamma": 1.5}, "gamma: must be in"),
        ({"lam": -0.1}, "lam: must be in"),
        ({"token_rewards": torch.zeros(5)}, "token_rewards: shape"),
        ({"token_rewards": torch.ones(4)}, "token_rewards: non-zero outside loss_mask"),
    ],
)
def test_gae_validates_its_inputs(kwargs, message) -> None:
    args = {
        "values": torch.zeros(4),
        "token_rewards": torch.tensor([0.0, 1.0, 0.0, 0.0]),
        "loss_mask": torch.tensor([0, 1, 0, 0]),
        "cu_seqlens": torch.tensor([0, 4]),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        gae(**args)


def test_terminal_rewards() -> None:
    # two trajectories: [p a a o] and [p a]: scores land on positions 2 and 5
    mask = torch.tensor([0, 1, 1, 0, 0, 1])
    out = terminal_rewards(torch.tensor([2.0, -1.0]), mask, torch.tensor([0, 4, 6]))
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, 2.0, 0.0, 0.0, -1.0]))
    gen = torch.Generator().manual_seed(5)
    for _ in range(30):
        cu, mask = random_pack(gen)
        scores = torch.randn(cu.numel() - 1, generator=gen)
        has_actions = torch.tensor(
            [bool(mask[a:b].any()) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]
        )
        scores = scores * has_actions
        torch.testing.assert_close(
            terminal_rewards(scores, mask, cu), terminal_ref(scores, mask, cu).float()
        )


def test_terminal_reward_on_a_trajectory_without_actions_is_an_error() -> None:
    with pytest.raises(ValueError, match="trajectory 1 has a non-zero score"):
        terminal_rewards(
            torch.tensor([1.0, 1.0]), torch.tensor([0, 1, 0, 0]), torch.tensor([0, 2, 4])
        )


def test_kl_in_reward_shifts_the_first_value_target_by_minus_point_four() -> None:
    # The seed's check: beta = 0.2, per-token KL 0.5 over four action tokens, gamma = lam = 1.
    # Each action's reward drops by 0.2 * 0.5 = 0.1; the return at t=0 sums four of them: -0.4.
    mask = torch.tensor([1, 1, 1, 1])
    cu = torch.tensor([0, 4])
    values = torch.tensor([0.3, 0.2, 0.1, 0.0])
    base = terminal_rewards(torch.tensor([1.0]), mask, cu)
    shaped = kl_in_reward(base, torch.full((4,), 0.5), 0.2, mask)
    _, plain = gae(values, base, mask, cu, 1.0, 1.0)
    _, penalised = gae(values, shaped, mask, cu, 1.0, 1.0)
    torch.testing.assert_close(penalised[0] - plain[0], torch.tensor(-0.4))


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo"])
def test_group_advantages_match_the_reference(method: str) -> None:
    gen = torch.Generator().manual_seed(6)
    for _ in range(20):
        groups = torch.randint(0, 5, (24,), generator=gen)
        rewards = torch.randint(0, 3, (24,), generator=gen).float()
        adv = group_advantages(rewards, groups, method)
        uniform = uniform_groups(rewards, groups)
        torch.testing.assert_close(adv, group_ref(rewards, groups, method).float())
        for i in range(24):
            same = rewards[groups == groups[i]]
            assert bool(uniform[i]) == bool((same == same[0]).all())


def test_group_advantage_hand_examples() -> None:
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 5.0]), torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.5, population std 0.5; group 1 is uniform
    grpo = group_advantages(rewards, groups, "grpo", eps=0.0)
    uniform = uniform_groups(rewards, groups)
    torch.testing.assert_close(grpo, torch.tensor([1.0, -1.0, -1.0, 1.0, 0.0, 0.0]))
    assert uniform.tolist() == [False] * 4 + [True] * 2
    # rloo: the others of a 1 average (0 + 0 + 1) / 3, so its advantage is 2/3
    rloo = group_advantages(rewards, groups, "rloo")
    torch.testing.assert_close(rloo, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0]))


def test_whiten_matches_the_textbook_formula() -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(50, generator=gen) * 3 + 1
    mask = (torch.rand(50, generator=gen) < 0.7).long()
    kept = x[mask.bool()].double()
    expected = (x.double() - kept.mean()) / (kept.std(unbiased=True) + 1e-8) * mask
    torch.testing.assert_close(whiten(x, mask), expected.float())
    assert math.isclose(float(whiten(x, mask)[mask.bool()].mean()), 0.0, abs_tol=1e-6)
