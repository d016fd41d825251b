import itertools
import math

import pytest
import torch

from tracerl.trace.schema import Trajectory
from tracerl.train.batch import (
    PackedBatch,
    SampleError,
    TrainSample,
    micro_batches,
    plan_buckets,
    plan_packs,
    plan_padded,
    resolve_batching,
)

from .conftest import make_samples

CPU = torch.device("cpu")


def test_first_fit_decreasing_respects_the_budget_and_places_every_sample_once() -> None:
    lengths = [7, 3, 9, 2, 5, 5, 1, 12]
    rows = plan_packs(lengths, token_budget=10)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    for row in rows:
        assert row == sorted(row)
        assert sum(lengths[i] for i in row) <= 10 or len(row) == 1  # 12 gets a row of its own
    # 9+1, 7+3, 5+5, 5... : decreasing order, first fit: [12], [9,1], [7,3], [5,5], [2]
    assert rows == [[7], [2, 6], [0, 1], [4, 5], [3]]


def test_naive_padding_fills_rows_up_to_the_budget_over_the_longest() -> None:
    assert plan_padded([3, 10, 4, 2, 6], token_budget=25) == [[0, 1], [2, 3], [4]]
    assert plan_padded([30, 4], token_budget=25) == [[0], [1]]


def best_grouping_cost(lengths: list[int], budget: int, split_cost: float) -> float:
    """Every way to cut the longest-first order into runs, tried one by one."""
    ordered = sorted(lengths, reverse=True)
    best = math.inf
    for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
        runs, run = [], [ordered[0]]
        for length, cut in zip(ordered[1:], cuts, strict=True):
            if cut:
                runs.append(run)
                run = []
            run.append(length)
        runs.append(run)
        if all(len(r) == 1 or len(r) * r[0] <= budget for r in runs):
            best = min(best, sum(len(r) * r[0] + split_cost for r in runs))
    return best


def test_grouping_by_length_minimises_padding_plus_split_cost() -> None:
    lengths = [7, 3, 9, 2, 5, 5, 1, 12]
    # free splits: nothing padded; costly splits: the fewest micro-batches the budget allows
    assert plan_buckets(lengths, 16, split_cost=0) == [[i] for i in (7, 2, 0, 4, 5, 1, 3, 6)]
    # split cost 4: 12 and 9 run alone (2 x 12, 2 x 9 > 16), then e.g. [7] [5 5 3] [2 1]:
    # padded 12 + 9 + 7 + 15 + 4 = 47, + 5 x 4 = 67 ([7 5] [5 3] [2 1] gives 49 + 20 = 69)
    groups = plan_buckets(lengths, 16, split_cost=4)
    assert sum(len(g) * max(lengths[i] for i in g) + 4 for g in groups) == 67
    assert groups[:2] == [[7], [2]]
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        n = int(torch.randint(1, 9, (1,), generator=gen))
        sample = torch.randint(1, 20, (n,), generator=gen).tolist()
        budget = int(torch.randint(10, 60, (1,), generator=gen))
        split = float(torch.randint(0, 30, (1,), generator=gen))
        groups = plan_buckets(sample, budget, split)
        assert sorted(i for g in groups for i in g) == list(range(n))
        cost = sum(len(g) * max(sample[i] for i in g) + split for g in groups)
        assert cost == best_grouping_cost(sample, budget, split), (sample, budget, split)
        assert all(len(g) == 1 or len(g) * max(sample[i] for i in g) <= budget for g in groups)


def test_auto_batching_packs_only_for_flash_attention() -> None:
    class Model:
        def __init__(self, attention: str) -> None:
            self.config = type("Config", (), {"_attn_implementation": attention})()

    assert resolve_batching("auto", Model("sdpa")) == "bucket"
    assert resolve_batching("auto", Model("eager")) == "bucket"
    assert resolve_batching("auto", Model("flash_attention_2")) == "pack"
    assert resolve_batching("pad", Model("flash_attention_2")) == "pad"


@pytest.mark.parametrize("batching", ["pack", "bucket", "pad"])
def test_micro_batches_map_outputs_back_to_action_tokens(batching: str) -> None:
    samples = make_samples(0, count=5)
    batch = PackedBatch.build(samples, CPU)
    mbs = micro_batches(batch, [4, 0, 2, 3], token_budget=20, batching=batching)  # type: ignore[arg-type]
    seen = torch.cat([mb.actions for mb in mbs])
    chosen = torch.cat([batch.token_index([i]) for i in [4, 0, 2, 3]])
    assert sorted(seen.tolist()) == sorted(chosen[batch.loss_mask[chosen].bool()].tolist())
    for mb in mbs:
        assert int(mb.keep.sum()) == mb.actions.numel()
        # the output at a kept position predicts the token after it, which is an action
        rows, cols = mb.keep.nonzero(as_tuple=True)
        assert torch.equal(mb.input_ids[rows, cols + 1], mb.tokens)
        assert torch.equal(batch.token_ids[mb.actions], mb.tokens)
        counts = [int(batch.loss_mask[batch.token_index([i])].sum()) for i in mb.samples]
        assert mb.cu_seqlens.tolist() == [sum(counts[:j]) for j in range(len(counts) + 1)]
        if batching == "pack":
            assert mb.input_ids.shape[0] == 1
            assert mb.num_tokens <= 20 or len(mb.samples) == 1
            starts = (mb.position_ids == 0).nonzero()[:, 1].tolist()  # type: ignore[union-attr]
            assert len(starts) == len(mb.samples)
        elif batching == "bucket":
            assert mb.input_ids.shape[1] == max(batch.lengths[i] for i in mb.samples)
            assert mb.num_tokens <= 20 or len(mb.samples) == 1
        else:
            assert mb.input_ids.shape[1] == max(batch.lengths)
            assert mb.attention_mask is not None
            assert int(mb.attention_mask.sum()) == sum(batch.lengths[i] for i in mb.samples)


def test_select_and_token_index_follow_the_given_order() -> None:
    batch = PackedBatch.build(make_samples(1, count=4), CPU)
    sub = batch.select([2, 0])
    assert sub.lengths == [batch.lengths[2], batch.lengths[0]]
    assert torch.equal(sub.token_ids, batch.token_ids[batch.token_index([2, 0])])
    assert sub.cu_seqlens.tolist() == [0, batch.lengths[2], batch.lengths[2] + batch.lengths[0]]


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (TrainSample([1, 2], [0, 1], [0.0], 1.0), "lengths 2, 2, 1"),
        (TrainSample([1], [0], [0.0], 1.0), "at least 2 tokens"),
        (TrainSample([1, 2], [1, 1], [-1.0, -1.0], 1.0), r"loss_mask\[0\] is 1"),
        (TrainSample([1, 2], [0, 2], [0.0, -1.0], 1.0), "only 0 and 1"),
        (TrainSample([1, 2], [0, 1], [0.0, float("nan")], 1.0), r"logprobs\[1\] is nan"),
        (TrainSample([1, 2], [0, 1], [0.0, -1.0], float("inf")), "reward is inf"),
    ],
)
def test_bad_samples_are_refused_naming_sample_and_field(sample: TrainSample, message: str) -> None:
    good = TrainSample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -2.0], 0.0)
    with pytest.raises(SampleError, match=rf"sample 1: .*{message}"):
        PackedBatch.build([good, sample], CPU)
    with pytest.raises(SampleError, match="at least one sample"):
        PackedBatch.build([], CPU)


def test_a_recorded_trajectory_converts_field_for_field() -> None:
    traj = Trajectory(
        token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.5, -1.5],
        turn_indices=[0],
    )  # fmt: skip
    sample = TrainSample.from_trajectory(traj, reward=1.0, group_id=3, weight_version=7)
    assert sample == TrainSample([5, 6, 7, 8], [0, 0, 1, 1], [0.0, 0.0, -0.5, -1.5], 1.0, 3, 7)
