import pytest
import torch

from tests.unit.algo.references import aggregate_ref, policy_ref, random_pack, value_ref
from tracerl.algo.distributed import global_token_count
from tracerl.algo.losses import (
    aggregate,
    entropy_from_logits,
    kl_penalty,
    kl_per_token,
    policy_loss,
    value_loss,
)

AGGS = ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]


def test_policy_loss_hand_examples() -> None:
    # token 0: A = +1, ratio 1.5 -> max(-1.5, -1 * 1.2) = -1.2 (clipped)
    # token 1: A = -1, ratio 0.5 -> max(0.5, 1 * 0.8) = 0.8 (clipped)
    # token 2: A = -1, ratio 5.0 -> max(5.0, 1.2) = 5.0; dual clip c = 3 bounds it at 3.0
    lp = torch.log(torch.tensor([1.5, 0.5, 5.0]))
    old = torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, -1.0])
    mask = torch.ones(3)
    loss, metrics = policy_loss(lp, old, adv, mask)
    torch.testing.assert_close(loss, torch.tensor((-1.2 + 0.8 + 5.0) / 3))
    assert metrics["clip_frac"] == pytest.approx(2 / 3)
    loss, metrics = policy_loss(lp, old, adv, mask, dual_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor((-1.2 + 0.8 + 3.0) / 3))
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("agg", AGGS)
def test_policy_loss_matches_the_reference(agg: str) -> None:
    gen = torch.Generator().manual_seed(11)
    for trial in range(20):
        cu, mask = random_pack(gen)
        t = mask.numel()
        lp = torch.randn(t, generator=gen) * 0.3 - 1
        old = lp + torch.randn(t, generator=gen) * 0.2
        rollout = old + torch.randn(t, generator=gen) * 0.1
        adv = torch.randn(t, generator=gen)
        dual = 3.0 if trial % 2 else None
        cap = 1.5 if trial % 3 else None
        loss, _ = policy_loss(
            lp,
            old,
            adv,
            mask,
            clip_low=0.2,
            clip_high=0.28,
            dual_clip=dual,
            agg=agg,
            cu_seqlens=cu,
            rollout_logprobs=rollout,
            tis_cap=cap,
        )
        per_token = policy_ref(lp, old, adv, 0.2, 0.28, dual, rollout, cap)
        torch.testing.assert_close(
            loss, torch.tensor(aggregate_ref(per_token, mask, agg, cu), dtype=torch.float32)
        )


def test_masked_tokens_get_no_gradient() -> None:
    lp = torch.randn(6, requires_grad=True)
    mask = torch.tensor([0, 1, 1, 0, 1, 0])
    loss, _ = policy_loss(lp, lp.detach() + 0.1, torch.randn(6), mask)
    loss.backward()
    assert lp.grad is not None
    assert torch.all(lp.grad[mask == 0] == 0) and torch.all(lp.grad[mask == 1] != 0)


def test_value_loss_hand_example_and_reference() -> None:
    # V = 2, V_old = 1, R = 0, clip 0.5: unclipped (2 - 0)^2 = 4, clipped (1.5 - 0)^2 = 2.25;
    # the larger is kept: 0.5 * 4 = 2. V = 0.2, V_old = 1, R = 1: unclipped 0.64,
    # clipped (0.5 - 1)^2 = 0.25 -> 0.5 * 0.64 = 0.32.
    loss, metrics = value_loss(
        torch.tensor([2.0, 0.2]),
        torch.tensor([1.0, 1.0]),
        torch.tensor([0.0, 1.0]),
        torch.ones(2),
        clip=0.5,
    )
    torch.testing.assert_close(loss, torch.tensor((2.0 + 0.32) / 2))
    assert metrics["value_clip_frac"] == 0.0
    gen = torch.Generator().manual_seed(12)
    for clip in (None, 0.2, 1.0):
        cu, mask = random_pack(gen)
        t = mask.numel()
        v, old, ret = (torch.randn(t, generator=gen) for _ in range(3))
        for agg in AGGS:
            loss, _ = value_loss(v, old, ret, mask, clip=clip, agg=agg, cu_seqlens=cu)
            ref = aggregate_ref(value_ref(v, old, ret, clip), mask, agg, cu)
            torch.testing.assert_close(loss, torch.tensor(ref, dtype=torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kl_estimators_and_penalty_is_the_reduced_per_token_kl(dtype) -> None:
    gen = torch.Generator().manual_seed(13)
    lp = (torch.randn(40, generator=gen) * 0.5 - 2).to(dtype)
    ref = (lp.float() + torch.randn(40, generator=gen) * 0.3).to(dtype)
    mask = (torch.rand(40, generator=gen) < 0.7).long()
    d = lp.float() - ref.float()
    expected = {"k1": d, "k2": 0.5 * d * d, "k3": torch.exp(-d) - 1 + d}
    for name, want in expected.items():
        got = kl_per_token(lp, ref, name)  # type: ignore[arg-type]
        torch.testing.assert_close(got, want)  # float32 whatever the input dtype
        penalty = kl_penalty(lp, ref, mask, estimator=name, coef=0.1)  # type: ignore[arg-type]
        assert torch.equal(penalty, 0.1 * aggregate(got, mask))  # bitwise the same reduction
    assert bool((kl_per_token(lp, ref, "k3") >= 0).all())


def test_entropy_from_logits() -> None:
    # uniform logits over 8 classes: entropy log 8
    torch.testing.assert_close(entropy_from_logits(torch.zeros(3, 8)), torch.full((3,), 2.0794415))
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(14))
    p = torch.softmax(logits.double(), -1)
    torch.testing.assert_close(entropy_from_logits(logits), (-(p * p.log()).sum(-1)).float())


def test_loss_is_invariant_to_micro_batch_splits() -> None:
    # One optimizer step over 3 micro-batches with one global denominator equals the full batch.
    gen = torch.Generator().manual_seed(15)
    lp = torch.randn(30, generator=gen, requires_grad=True)
    old, adv = lp.detach() + 0.1 * torch.randn(30, generator=gen), torch.randn(30, generator=gen)
    mask = (torch.rand(30, generator=gen) < 0.6).long()
    full, _ = policy_loss(lp, old, adv, mask)
    (full_grad,) = torch.autograd.grad(full, lp)
    denominator = global_token_count(mask)
    total = torch.zeros(())
    for piece in (slice(0, 7), slice(7, 19), slice(19, 30)):
        part, _ = policy_loss(
            lp[piece], old[piece], adv[piece], mask[piece], denominator=denominator
        )
        total = total + part
    (split_grad,) = torch.autograd.grad(total, lp)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(split_grad, full_grad)


def test_aggregation_needs_cu_seqlens_for_sequence_modes() -> None:
    with pytest.raises(ValueError, match="cu_seqlens: required"):
        aggregate(torch.ones(3), torch.ones(3), "seq_mean_token_sum")
    with pytest.raises(ValueError, match="agg: expected"):
        aggregate(torch.ones(3), torch.ones(3), "mean")  # type: ignore[arg-type]


def test_bfloat16_inputs_are_computed_in_float32() -> None:
    gen = torch.Generator().manual_seed(16)
    cu, mask = random_pack(gen)
    t = mask.numel()
    lp = (torch.randn(t, generator=gen) * 0.3 - 2).bfloat16()
    old = (lp.float() + torch.randn(t, generator=gen) * 0.2).bfloat16()
    adv = torch.randn(t, generator=gen).bfloat16()
    loss, _ = policy_loss(lp, old, adv, mask)
    assert loss.dtype == torch.float32
    ref = aggregate_ref(
        policy_ref(lp.float(), old.float(), adv.float(), 0.2, 0.2, None, None, None),
        mask,
        "token_mean",
        cu,
    )
    torch.testing.assert_close(loss, torch.tensor(ref, dtype=torch.float32))
    v, o, r = (torch.randn(t, generator=gen).bfloat16() for _ in range(3))
    vloss, _ = value_loss(v, o, r, mask, clip=0.2)
    ref = aggregate_ref(value_ref(v.float(), o.float(), r.float(), 0.2), mask, "token_mean", cu)
    torch.testing.assert_close(vloss, torch.tensor(ref, dtype=torch.float32))


@pytest.mark.parametrize("agg", AGGS)
def test_the_trainers_action_layout_gives_the_masked_loss(agg: str) -> None:
    # The trainer gathers action tokens before the losses and passes no mask: the same losses
    # as the full layout with its mask, cu_seqlens counting each trajectory's action tokens.
    gen = torch.Generator().manual_seed(17)
    for _ in range(10):
        cu, mask = random_pack(gen)
        t, m = mask.numel(), mask.bool()
        lp, old, adv, v, ret = (torch.randn(t, generator=gen) for _ in range(5))
        counts = [
            int(mask[a:b].sum()) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)
        ]
        action_cu = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()])
        full, full_m = policy_loss(lp, old, adv, mask, agg=agg, cu_seqlens=cu, dual_clip=3.0)
        gathered, gathered_m = policy_loss(
            lp[m], old[m], adv[m], agg=agg, cu_seqlens=action_cu, dual_clip=3.0
        )
        torch.testing.assert_close(gathered, full)
        assert gathered_m == pytest.approx(full_m)
        full_v, _ = value_loss(v, old, ret, mask, clip=0.2, agg=agg, cu_seqlens=cu)
        gathered_v, _ = value_loss(v[m], old[m], ret[m], clip=0.2, agg=agg, cu_seqlens=action_cu)
        torch.testing.assert_close(gathered_v, full_v)
        full_kl = kl_penalty(lp, old, mask, agg=agg, cu_seqlens=cu)
        torch.testing.assert_close(
            kl_penalty(lp[m], old[m], agg=agg, cu_seqlens=action_cu), full_kl
        )


def test_a_mask_of_another_shape_is_named() -> None:
    with pytest.raises(ValueError, match=r"loss_mask: shape \(2,\) does not match logprobs \(3,\)"):
        policy_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(2))
