"""A session page says how each turn joins the session's trajectories: the turn it extends,
whether it was bridged across a reply the template re-renders, or why it starts a new one."""

from __future__ import annotations

from html import escape

from tracerl.trace.schema import SessionTrace, Turn
from tracerl.view.pages import session_body


def turn(index: int, **fields: object) -> Turn:
    return Turn.model_validate(
        {
            "index": index, "endpoint": "chat.completions", "prompt_ids": [1, 2],
            "completion_ids": [3], "completion_logprobs": [-0.1], "finish_reason": "stop",
            "weight_version": 0, "request": {"messages": []}, "response": {}, **fields,
        }
    )  # fmt: skip


def test_each_turn_says_how_it_joins_the_trajectories() -> None:
    why = "the chat template renders turn 0's reply differently than it was sampled"
    trace = SessionTrace(
        session_id="s",
        status="closed",
        turns=[turn(0), turn(1, parent=0, bridged=True), turn(2, fork_reason=why)],
        trajectories=[],
    )
    html = session_body(trace, [], None)
    assert "extends turn 0 (bridged: the template re-renders that reply)" in html
    assert escape(f"new trajectory: {why}") in html  # as the page escapes text
    assert html.count("bridged") == 1
