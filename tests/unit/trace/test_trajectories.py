import pytest

from tracerl.trace.schema import SessionTrace, Turn
from tracerl.trace.trajectories import TraceError, assemble_trajectories


def turn(index, prompt, completion, parent=None, logprob=-0.5):
    return Turn(
        index=index,
        endpoint="chat.completions",
        prompt_ids=prompt,
        completion_ids=completion,
        completion_logprobs=[logprob] * len(completion),
        finish_reason="stop",
        weight_version=0,
        request={},
        response={},
        parent=parent,
    )


def test_a_chain_of_turns_is_one_trajectory() -> None:
    # turn 0: prompt [1 2], sampled [3 4]; turn 1 extends it with [5] and samples [6].
    turns = [turn(0, [1, 2], [3, 4]), turn(1, [1, 2, 3, 4, 5], [6], parent=0)]
    (traj,) = assemble_trajectories(turns)
    assert traj.token_ids == [1, 2, 3, 4, 5, 6]
    assert traj.loss_mask == [0, 0, 1, 1, 0, 1]
    assert traj.logprobs == [0.0, 0.0, -0.5, -0.5, 0.0, -0.5]
    assert traj.turn_indices == [0, 1]


def test_a_turn_without_parent_starts_a_new_trajectory() -> None:
    turns = [turn(0, [1, 2], [3]), turn(1, [9, 9], [8])]
    first, second = assemble_trajectories(turns)
    assert first.token_ids == [1, 2, 3] and second.token_ids == [9, 9, 8]
    assert second.loss_mask == [0, 0, 1]


def test_a_fork_trains_each_sampled_token_once() -> None:
    # Turns 1 and 2 both continue turn 0: turn 2 is a fork. Its copy of turn 0's tokens is
    # context (mask 0), so turn 0's completion [3] is trained only in the first trajectory.
    turns = [
        turn(0, [1, 2], [3]),
        turn(1, [1, 2, 3, 4], [5], parent=0),
        turn(2, [1, 2, 3, 7], [8], parent=0),
        turn(3, [1, 2, 3, 7, 8, 9], [10], parent=2),
    ]
    main, fork = assemble_trajectories(turns)
    assert main.token_ids == [1, 2, 3, 4, 5] and main.loss_mask == [0, 0, 1, 0, 1]
    assert fork.token_ids == [1, 2, 3, 7, 8, 9, 10]
    assert fork.loss_mask == [0, 0, 0, 0, 1, 0, 1]
    assert fork.turn_indices == [2, 3]
    trained = sum(main.loss_mask) + sum(fork.loss_mask)
    assert trained == sum(len(t.completion_ids) for t in turns)


def test_a_parent_the_child_does_not_extend_is_an_error() -> None:
    with pytest.raises(TraceError, match="turn 1 does not extend its parent 0"):
        assemble_trajectories([turn(0, [1], [2]), turn(1, [1, 9], [3], parent=0)])


def test_trace_round_trips_through_its_model() -> None:
    turns = [turn(0, [1, 2], [3, 4]), turn(1, [1, 2, 3, 4, 5], [6], parent=0)]
    trace = SessionTrace(
        session_id="s", status="open", turns=turns, trajectories=assemble_trajectories(turns)
    )
    assert SessionTrace.model_validate(trace.model_dump()) == trace
    assert SessionTrace.model_validate_json(trace.model_dump_json()) == trace
