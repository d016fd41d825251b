import pytest
import torch

from tracerl.gateway.schema import Trajectory
from tracerl.train.batch import (
    PackedBatch,
    SampleError,
    TrainSample,
    micro_batches,
    plan_packs,
    plan_padded,
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


@pytest.mark.parametrize("batching", ["pack", "pad"])
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
