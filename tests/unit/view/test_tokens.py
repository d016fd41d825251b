"""The token view: turn boundaries, sampled versus context tokens, forks, token text."""

from __future__ import annotations

from tests.viewer_run import turn
from tracerl.trace.schema import SessionTrace
from tracerl.trace.trajectories import assemble_trajectories
from tracerl.view.pages import heat
from tracerl.view.tokens import TokenText, token_view


def _trace(turns: list) -> SessionTrace:
    return SessionTrace(session_id="s", status="closed", turns=turns,
                        trajectories=assemble_trajectories(turns))  # fmt: skip


def test_turn_spans_sampled_tokens_and_a_fork() -> None:
    trace = _trace([
        turn(0, [1, 2], [20, 21]),
        turn(1, [1, 2, 20, 21, 6], [22], parent=0),
        turn(2, [1, 2, 20, 21, 7], [23, 24], parent=0),
    ])  # fmt: skip
    first, fork = token_view(trace, TokenText(None))
    assert [(s.turn, s.start, s.end) for s in first.spans] == [(0, 0, 4), (1, 4, 6)]
    assert first.loss_mask == [0, 0, 1, 1, 0, 1] and first.fork_of is None
    assert [s.weight_version for s in first.spans] == [0, 1]
    assert fork.fork_of == 0 and fork.loss_mask == [0, 0, 0, 0, 0, 1, 1]
    assert fork.sampled == 2
    assert first.texts[:2] == ["⟨1⟩", "⟨2⟩"]  # no tokenizer: ids


def test_a_tokenizer_that_cannot_load_leaves_ids_and_says_why() -> None:
    text = TokenText("no-such-model")
    assert text.texts([5, 6]) == ["⟨5⟩", "⟨6⟩"]
    assert text.problem is not None and "no-such-model" in text.problem


def test_heat_runs_from_red_to_green() -> None:
    assert heat(0.0) == "hsl(120,75%,80%)"
    assert heat(-100.0) == "hsl(0,75%,80%)"
    assert heat(-0.6931471805599453) == "hsl(60,75%,80%)"
