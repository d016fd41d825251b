"""Tree rows (`share_prefix`): a group's shared prompt forwarded once gives every sample the
outputs it gets alone, and a step over them the same update."""

from typing import Any

import pytest
import torch

from tracerl.train.batch import PackedBatch, TrainSample, micro_batches, prefix_units
from tracerl.train.forward import action_logprobs, all_logprobs, all_values
from tracerl.train.models import value_model_from_actor

CPU = torch.device("cpu")
PROMPT = [11, 12, 13, 14, 15, 16]


def sample(prompt: list[int], turns: list[tuple[list[int], list[int]]], group: int) -> TrainSample:
    """`prompt`, then (action, observation) pairs; rollout log-probs filled in later."""
    ids, mask = list(prompt), [0] * len(prompt)
    for action, observation in turns:
        ids += action + observation
        mask += [1] * len(action) + [0] * len(observation)
    logprobs = [-10.8 if m else 0.0 for m in mask]
    return TrainSample(ids, mask, logprobs, float(len(ids) % 2), group)


def grouped() -> list[TrainSample]:
    """Group 0: three samples of one prompt, multi-turn; group 1: two whose prompts part after
    two tokens; group 2: one sample alone; group 3: two whose first action starts at once."""
    return [
        sample(PROMPT, [([2001, 2002, 2003], [31, 32]), ([2004, 2005], [])], 0),
        sample(PROMPT, [([2011], [33]), ([2012, 2013, 2014, 2015], [])], 0),
        sample(PROMPT, [([2021, 2022, 2023, 2024, 2025, 2026], [])], 0),
        sample([21, 22, 23, 24], [([2031, 2032], [])], 1),
        sample([21, 22, 99, 24, 25], [([2041, 2042, 2043], [])], 1),
        sample([41, 42, 43], [([2051, 2052], [34, 35, 36]), ([2053], [])], 2),
        sample([51], [([2061, 2062], [])], 3),
        sample([51], [([2071], [])], 3),
    ]


def alone_logprobs(model: Any, samples: list[TrainSample], batch: PackedBatch) -> torch.Tensor:
    """Each sample's action log-probs from a full forward of it alone. `[N]`"""
    out = torch.zeros(batch.token_ids.numel())
    with torch.no_grad():
        for i, s in enumerate(samples):
            logits = model(torch.tensor([s.token_ids])).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.token_ids[1:])[:, None])
            start = int(batch.cu_seqlens[i])
            positions = torch.arange(start + 1, start + len(s.token_ids))
            mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
            out[positions[mask]] = lp[:, 0][mask]
    return out


def test_units_share_up_to_the_token_before_the_first_action() -> None:
    batch = PackedBatch.build(grouped(), CPU)
    units = prefix_units(batch, range(8), token_budget=1000)
    # group 0: 6 prompt tokens shared, the 6th predicts the first action so stays per sample;
    # group 1: they part at the third token; group 3: nothing before the first action's input
    assert units == [([0, 1, 2], 5), ([3, 4], 2), ([5], 0), ([6], 0), ([7], 0)]
    # a unit over the budget is cut into runs of members that fit, each with the prefix
    lengths = batch.lengths
    budget = 5 + (lengths[0] - 5) + (lengths[1] - 5)
    assert prefix_units(batch, [0, 1, 2], budget) == [([0, 1], 5), ([2], 0)]
    assert prefix_units(batch, [2, 0], 1000) == [([2, 0], 5)]  # the given order is kept


@pytest.mark.parametrize("budget", [1000, 24])
def test_tree_rows_give_each_sample_its_own_logprobs(tiny: tuple[Any, Any], budget: int) -> None:
    model, _ = tiny
    samples = grouped()
    batch = PackedBatch.build(samples, CPU)
    order = [7, 0, 3, 1, 5, 2, 4, 6]
    mbs = micro_batches(batch, order, budget, "bucket", share_prefix=True)
    assert sorted(i for mb in mbs for i in mb.samples) == list(range(8))
    trees = [mb for mb in mbs if mb.attention_mask is not None and mb.attention_mask.dim() == 4]
    assert trees, "nothing was shared"
    ids = torch.cat([mb.input_ids.flatten() for mb in mbs])
    if budget == 1000:  # each shared prompt was forwarded once, not once per sample
        assert int((ids == PROMPT[0]).sum()) == 1 and int((ids == 21).sum()) == 1
    for mb in mbs:
        assert mb.num_tokens <= budget or len(mb.samples) == 1 or budget == 1000
        rows, cols = mb.keep.nonzero(as_tuple=True)
        assert torch.equal(mb.input_ids[rows, cols + 1], mb.tokens)
    lp = all_logprobs(model, mbs, batch.token_ids.numel(), 1.0, CPU)
    torch.testing.assert_close(lp, alone_logprobs(model, samples, batch), rtol=1e-4, atol=1e-5)
    # and the same through the bucket rows without sharing
    plain = micro_batches(batch, order, budget, "bucket")
    torch.testing.assert_close(lp, all_logprobs(model, plain, lp.numel(), 1.0, CPU))
    # entropies and gradients are per sample too: one backward through each layout
    grads = []
    for layout in (mbs, plain):
        model.zero_grad()
        for mb in layout:
            logprobs, _ = action_logprobs(model, mb, 1.0, with_entropy=True)
            logprobs.sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    model.zero_grad()
    # the same up to float rounding of sums taken in another order
    assert float((grads[0] - grads[1]).norm()) <= 1e-4 * float(grads[1].norm())


def test_tree_rows_give_each_sample_its_own_values(tiny: tuple[Any, Any]) -> None:
    critic = value_model_from_actor(tiny[0])
    batch = PackedBatch.build(grouped(), CPU)
    n = batch.token_ids.numel()
    shared = all_values(
        critic, micro_batches(batch, range(8), 1000, "bucket", share_prefix=True), n, CPU
    )
    alone = all_values(critic, micro_batches(batch, range(8), 1, "pack"), n, CPU)
    torch.testing.assert_close(shared, alone, rtol=1e-4, atol=1e-5)
    assert bool((shared[batch.loss_mask == 1] != 0).all())


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_step_over_tree_rows_is_the_step_over_samples(make_trainer: Any, algorithm: str) -> None:
    samples = grouped()
    params = []
    for share in (True, False):
        trainer = make_trainer(
            algorithm=algorithm, share_prefix=share, token_budget=1000,
            actor={"lr": 10.0, "max_grad_norm": None},
        )  # fmt: skip
        # SGD: Adam's normalisation would turn rounding-sized differences into lr-sized steps
        trainer.actor_optimizer = torch.optim.SGD(trainer.actor.parameters(), lr=10.0)
        before = torch.cat([p.detach().flatten().clone() for p in trainer.actor.parameters()])
        metrics = trainer.step(samples)
        after = torch.cat([p.detach().flatten() for p in trainer.actor.parameters()])
        params.append(after - before)
        assert metrics["perf/tokens"] > 0
    assert float(params[1].abs().max()) > 0
    assert float((params[0] - params[1]).norm()) <= 1e-4 * float(params[1].norm())
