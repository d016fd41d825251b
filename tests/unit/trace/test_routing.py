"""Routed-experts records (`tracerl.routing`): dtype, JSON form, merging across attempts and
turns, trajectory assembly, the engine wire, and the trainer's micro-batch layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tracerl.engine.client import EngineReplyError, output_from_wire
from tracerl.engine.types import GenerateOutput
from tracerl.routing import RoutedExperts, blank, fit, merge, missing, routing_dtype, unrecorded
from tracerl.trace.schema import Turn
from tracerl.trace.trajectories import TraceError, assemble_trajectories
from tracerl.train import TrainSample
from tracerl.train.batch import PackedBatch, SampleError, micro_batches


def rows(values: list[int], layers: int = 2, top_k: int = 2) -> np.ndarray:
    """A record whose position p routes every slot to expert `values[p]` (-1: unrecorded)."""
    out = blank(len(values), layers, top_k, np.uint8)
    for p, v in enumerate(values):
        if v >= 0:
            out[p] = v
    return out


def test_dtype_follows_the_expert_count() -> None:
    assert routing_dtype(8) == np.uint8 and routing_dtype(254) == np.uint8
    assert routing_dtype(255) == np.uint16 and routing_dtype(4096) == np.uint16
    with pytest.raises(ValueError, match="num_experts"):
        routing_dtype(70000)
    assert missing(np.uint8) == 255 and missing("uint16") == 65535


def test_json_form_round_trips_and_rejects_a_wrong_length() -> None:
    record = rows([3, 1, 4, -1])
    back = RoutedExperts.model_validate_json(RoutedExperts.of(record).model_dump_json()).array()
    np.testing.assert_array_equal(back, record)
    short = RoutedExperts(dtype="uint8", shape=[5, 2, 2], data=RoutedExperts.of(record).data)
    with pytest.raises(ValueError, match=r"16 bytes, but shape \[5, 2, 2\] of uint8 needs 20"):
        short.array()
    with pytest.raises(ValueError, match="expected one of uint8, uint16"):
        RoutedExperts(dtype="int64", shape=[1, 1, 1], data="")


def test_merge_keeps_the_earlier_record_where_it_has_one() -> None:
    earlier = rows([1, 1, -1])  # an aborted attempt: its last position never fed
    later = rows([2, 2, 2, 2, -1])  # the resumed one recomputed everything
    merged = merge(earlier, later)
    assert merged is not None
    np.testing.assert_array_equal(merged[:, 0, 0], [1, 1, 2, 2, 255])
    assert merge(None, later) is later and merge(earlier, None) is earlier
    with pytest.raises(ValueError, match="different models"):
        merge(earlier, rows([1], layers=3))
    padded = fit(rows([1, 2]), 4)
    assert padded.shape == (4, 2, 2) and list(unrecorded(padded)) == [False, False, True, True]


def turn(index: int, prompt: list[int], completion: list[int], routing: list[int] | None,
         parent: int | None = None) -> Turn:  # fmt: skip
    return Turn(
        index=index, endpoint="chat.completions", prompt_ids=prompt, completion_ids=completion,
        completion_logprobs=[-0.5] * len(completion), finish_reason="stop", weight_version=0,
        request={}, response={}, parent=parent,
        routed_experts=None if routing is None else RoutedExperts.of(rows(routing)),
    )  # fmt: skip


def test_trajectories_assemble_routing_row_by_row() -> None:
    """A continuation keeps its first turn's rows and takes the rest from the second (the
    first turn's last token was fed only in the second); a fork starts its own record; a
    trajectory none of whose turns recorded any has none."""
    t0 = turn(0, [1, 2], [3], [10, 11, -1])
    t1 = turn(1, [1, 2, 3, 4], [5], [20, 21, 22, 23, -1], parent=0)
    fork = turn(2, [1, 2, 3, 9], [8], [30, 31, 32, 33, -1], parent=0)
    plain = turn(3, [7], [6], None)
    first, forked, bare = assemble_trajectories([t0, t1, fork, plain])
    assert first.token_ids == [1, 2, 3, 4, 5] and first.routed_experts is not None
    np.testing.assert_array_equal(first.routed_experts.array()[:, 0, 0], [10, 11, 22, 23, 255])
    assert forked.routed_experts is not None
    np.testing.assert_array_equal(forked.routed_experts.array()[:, 1, 1], [30, 31, 32, 33, 255])
    assert bare.routed_experts is None
    other_model = t1.model_copy(update={"routed_experts": RoutedExperts.of(rows([1] * 5, 3))})
    with pytest.raises(TraceError, match="turn 1: routed experts of shapes"):
        assemble_trajectories([t0, other_model])


def test_the_engine_wire_carries_the_record() -> None:
    record = rows([5, 6, -1])
    out = GenerateOutput("r", [7], [-0.1], 2, 1, 0, "stop", routed_experts=record)
    np.testing.assert_array_equal(output_from_wire(out.to_wire()).routed_experts, record)
    bare = GenerateOutput("r", [7], [-0.1], 2, 1, 0, "stop").to_wire()
    assert (
        "routed_experts" not in bare["meta_info"] and output_from_wire(bare).routed_experts is None
    )
    broken = out.to_wire()
    broken["meta_info"]["routed_experts"]["shape"] = [4, 2, 2]
    with pytest.raises(EngineReplyError, match="meta_info.routed_experts: 12 bytes"):
        output_from_wire(broken)


def sample(
    prompt: list[int], completion: list[int], routing: list[int] | None, group: int
) -> TrainSample:
    n = len(prompt) + len(completion)
    return TrainSample(
        prompt + completion, [0] * len(prompt) + [1] * len(completion), [0.0] * len(prompt)
        + [-0.5] * len(completion), 1.0, group,
        routed_experts=None if routing is None else rows(routing[:n]),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("batching", "share"), [("pack", False), ("bucket", False), ("pad", False), ("bucket", True)]
)
def test_micro_batches_lay_routing_out_like_their_tokens(batching: str, share: bool) -> None:
    """Every cell of a micro-batch's routing is its token's record (-1 for padding, for a
    sample without one and for unrecorded positions), in every layout."""
    samples = [
        sample([1, 2, 3], [4, 5], [11, 12, 13, 14, -1], 0),
        sample([1, 2, 3], [6], [11, 12, 13, -1], 0),
        sample([9, 8], [7, 6, 5], None, 1),
    ]
    batch = PackedBatch.build(samples, torch.device("cpu"))
    assert batch.routing is not None
    recorded = 0
    for mb in micro_batches(batch, [0, 1, 2], 64, batching, share_prefix=share):  # type: ignore[arg-type]
        assert mb.routing is not None and mb.routing.shape[:2] == mb.input_ids.shape
        by_token = {11: 1, 12: 2, 13: 3, 14: 4}  # the record says which token it belongs to
        for r in range(mb.input_ids.shape[0]):
            for c in range(mb.input_ids.shape[1]):
                value = int(mb.routing[r, c, 0, 0])
                if value >= 0:
                    assert by_token[value] == int(mb.input_ids[r, c])
        recorded += int((mb.routing[..., 0, 0] >= 0).sum())
    # a tree row holds the shared prompt [1, 2] once: 2 + 2 + 1 records, else 4 + 3
    assert recorded == (5 if share else 7)
    assert PackedBatch.build(samples, torch.device("cpu"), routing=False).routing is None


def test_a_sample_whose_routing_does_not_match_its_tokens_is_refused() -> None:
    bad = sample([1, 2], [3], [1, 2], 0)
    with pytest.raises(SampleError, match=r"sample 0: routed_experts has shape \(2, 2, 2\)"):
        PackedBatch.build([bad], torch.device("cpu"))
