"""Reward functions: exact-answer parsing, the concise grade, and rewards over a recorded trace."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from tracerl.envs.rewards import (
    concise_reward,
    count_words,
    exact_answer_reward,
    extract_answer,
    final_text,
    load_reward_fn,
    parse_number,
)
from tracerl.trace.schema import SessionTrace


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("17 + 25 = 42", Fraction(42)),
        ("The answer is 42.", Fraction(42)),
        ("5 - 8 = -3", Fraction(-3)),
        ("8-3 is 5", Fraction(5)),
        ("(2)-3", Fraction(3)),  # after ")" a minus is an operator, not a sign
        ("It is 1,234 apples", Fraction(1234)),
        ("3.50 dollars", Fraction(7, 2)),
        ("x2 and y", None),  # a digit inside a word is not a number
        ("The result is \\boxed{12} since 6 * 2", Fraction(12)),
        ("<answer>-7</answer> (checked with 3 - 10)", Fraction(-7)),
        ("<answer>1</answer> no, <answer>2</answer>", Fraction(2)),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, answer: Fraction | None) -> None:
    assert extract_answer(text) == answer


def test_exact_answer_reward() -> None:
    assert exact_answer_reward({"answer": 42}, "so 42") == 1.0
    assert exact_answer_reward({"answer": "42"}, "so 42.0") == 1.0
    assert exact_answer_reward({"answer": 0.5}, "1/2 is 0.5") == 1.0
    assert exact_answer_reward({"answer": 42}, "42 or 43") == 0.0  # the last number counts
    assert exact_answer_reward({"answer": 42}, "I don't know") == 0.0
    with pytest.raises(ValueError, match="expected a number"):
        exact_answer_reward({"answer": "forty-two"}, "42")
    with pytest.raises(ValueError, match="expected a number"):
        parse_number(True)


def test_concise_reward_is_graded() -> None:
    assert count_words("Paris — of course!") == 3
    assert concise_reward({"max_words": 10}, "Paris is the capital of France.") == 1.0
    twenty = " ".join(["word"] * 20)
    assert concise_reward({"max_words": 10}, twenty) == 0.5  # 10 / 20
    assert concise_reward({"max_words": 10}, " ".join(["w"] * 40)) == 0.25  # 10 / 40
    assert concise_reward({}, " ".join(["w"] * 10)) == 1.0  # default limit 10
    assert concise_reward({}, " ".join(["w"] * 11)) == pytest.approx(10 / 11)
    assert concise_reward({"max_words": 3}, "   ") == 0.0
    assert concise_reward({"max_words": 3}, "...") == 0.0


def _trace(*responses: tuple[str, dict[str, Any]]) -> SessionTrace:
    turns = [
        {
            "index": k,
            "endpoint": endpoint,
            "prompt_ids": [1],
            "completion_ids": [2],
            "completion_logprobs": [-0.5],
            "finish_reason": "stop",
            "weight_version": 0,
            "request": {},
            "response": response,
        }
        for k, (endpoint, response) in enumerate(responses)
    ]
    return SessionTrace.model_validate(
        {"session_id": "s", "status": "closed", "turns": turns, "trajectories": []}
    )


def _openai(text: str | None) -> tuple[str, dict[str, Any]]:
    return "chat.completions", {"choices": [{"message": {"role": "assistant", "content": text}}]}


def test_final_text_reads_the_last_turn_of_either_api() -> None:
    assert final_text(_trace(_openai("first"), _openai("last 7"))) == "last 7"
    assert final_text(_trace(_openai(None))) == ""
    anthropic = {
        "content": [
            {"type": "text", "text": "It is "},
            {"type": "tool_use", "id": "t", "name": "f", "input": {}},
            {"type": "text", "text": "9"},
        ]
    }
    assert final_text(_trace(("messages", anthropic))) == "It is 9"
    with pytest.raises(ValueError, match="recorded no turn"):
        final_text(_trace())


def test_load_reward_fn() -> None:
    trace = _trace(_openai("2 + 2 = 4"))
    assert load_reward_fn("arithmetic")({"answer": 4}, trace) == 1.0
    # "2 + 2 = 4" has three words ("+" and "=" are not words): 2 / 3
    assert load_reward_fn("concise")({"max_words": 2}, trace) == pytest.approx(2 / 3)
    custom = load_reward_fn("tests.unit.envs.test_rewards:turn_count_reward")
    assert custom({}, _trace(_openai("a"), _openai("b"))) == 2.0
    for bad, message in [
        ("nope", "expected one of"),
        ("no_such_module_xyz:f", "cannot import"),
        ("tests.unit.envs.test_rewards:missing", "no callable"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_reward_fn(bad)


def turn_count_reward(task: dict[str, Any], trace: SessionTrace) -> float:
    """A user reward function, loaded by name above."""
    return float(len(trace.turns))
