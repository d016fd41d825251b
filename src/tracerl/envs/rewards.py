"""Reward functions: exact numeric answers, the concise-reply grade, and rewards over a trace.

A text reward maps (task, final assistant text) to a float; the built-in environments apply it to
the reply they received. `load_reward_fn` turns a built-in name or a "module:function" into a
`TraceReward`, which reads the final text from the recorded trace instead: that is how an external
agent that prints no reward of its own is scored. Both paths see the same text, because the gateway
records exactly the response it returned.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from tracerl.envs.base import Task, TraceReward
from tracerl.trace.schema import SessionTrace

TextReward = Callable[[Task, str], float]

# A number: an optional sign (only where it cannot be a binary minus: not after a word character or
# a closing parenthesis), digits with optional thousands separators, an optional decimal part.
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")
# Explicit answer markers; when present only the last marked span is read.
_MARKED = re.compile(r"\\boxed\{([^{}]*)\}|<answer>(.*?)</answer>", re.DOTALL)
# Replies are asked for at most this many words when a task does not say.
DEFAULT_MAX_WORDS = 10


def parse_number(value: Any) -> Fraction:
    """An exact rational from an int, a float (read as its shortest decimal) or a numeric string."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    text = str(value).strip().replace(",", "")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"expected a number, got {value!r}") from None


def extract_answer(text: str) -> Fraction | None:
    """The reply's final answer: the last number inside the last `\\boxed{}` or `<answer>` span if
    there is one, else the last number in the text; None when there is no number."""
    marked = _MARKED.findall(text)
    if marked:
        boxed, tagged = marked[-1]
        text = boxed or tagged
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    return Fraction(numbers[-1].replace(",", ""))


def exact_answer_reward(task: Task, text: str) -> float:
    """1.0 when the reply's final answer equals `task["answer"]` exactly, else 0.0."""
    return 1.0 if extract_answer(text) == parse_number(task["answer"]) else 0.0


def count_words(text: str) -> int:
    """Whitespace-separated pieces holding at least one letter or digit ("—" is not a word)."""
    return sum(1 for piece in text.split() if any(c.isalnum() for c in piece))


def concise_reward(task: Task, text: str) -> float:
    """1.0 for a non-empty reply of at most `task["max_words"]` words, `limit / words` above it,
    0.0 for an empty one: graded, so a group of longer and shorter replies is never uniform."""
    limit = int(task.get("max_words", DEFAULT_MAX_WORDS))
    words = count_words(text)
    if words == 0:
        return 0.0
    return 1.0 if words <= limit else limit / words


TEXT_REWARDS: dict[str, TextReward] = {
    "arithmetic": exact_answer_reward,
    "calculator": exact_answer_reward,
    "concise": concise_reward,
}


def final_text(trace: SessionTrace) -> str:
    """The assistant text of the session's last turn, from the response the agent received."""
    if not trace.turns:
        raise ValueError(f"session {trace.session_id} recorded no turn")
    turn = max(trace.turns, key=lambda t: t.index)
    response = turn.response
    if turn.endpoint == "chat.completions":
        return str(response["choices"][0]["message"].get("content") or "")
    if turn.endpoint == "responses":
        return "".join(
            str(part.get("text", ""))
            for item in response["output"]
            if item.get("type") == "message"
            for part in item.get("content") or []
            if part.get("type") == "output_text"
        )
    return "".join(
        str(block.get("text", "")) for block in response["content"] if block.get("type") == "text"
    )


def from_final_text(reward: TextReward) -> TraceReward:
    """Lift a text reward to a trace reward over the last turn's assistant text."""

    def score(task: Task, trace: SessionTrace) -> float:
        return reward(task, final_text(trace))

    return score


def load_reward_fn(spec: str) -> TraceReward:
    """A built-in name ("arithmetic", "concise", "calculator") or "module:function", where the
    function takes (task, trace) and returns a float."""
    if spec in TEXT_REWARDS:
        return from_final_text(TEXT_REWARDS[spec])
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"reward_fn {spec!r}: expected one of {', '.join(sorted(TEXT_REWARDS))} "
            "or 'module:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward_fn {spec!r}: cannot import {module_name!r}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward_fn {spec!r}: {module_name} has no callable {attr!r}")
    return fn
