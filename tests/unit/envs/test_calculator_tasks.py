"""The calculator's generated questions: the two-operation set the benchmarks were measured on
stays as it was, `calculator-long`'s questions take three dependent one-operation calls and
`calculator-mixed`'s two or three, which their `max_calls` says."""

from __future__ import annotations

import re

import pytest

from tracerl.envs.calculator import run_tool, script
from tracerl.envs.expression import calculate, operations
from tracerl.envs.registry import generate_tasks


def test_the_two_operation_questions_are_the_ones_measured() -> None:
    # the first two of `bench learn`'s calculator train set (seed 0) in docs/benchmarks.md
    assert generate_tasks("calculator", 2, 0) == [
        {"prompt": "What is 784 * 20 + 48?", "answer": 15728},
        {"prompt": "What is (176 - 92) * 67?", "answer": 5628},
    ]


def test_the_three_operation_questions_are_the_ones_measured() -> None:
    # the first two of `bench learn`'s calculator-long train set (seed 0)
    assert generate_tasks("calculator-long", 2, 0) == [
        {"prompt": "What is (521 - 76) * 12 + 60?", "answer": 5400},
        {"prompt": "What is (432 - 70) * 66 + 61?", "answer": 23953},
    ]


@pytest.mark.parametrize("name", ["calculator-long", "calculator-mixed"])
def test_questions_take_one_dependent_call_per_operation_and_an_answer(name: str) -> None:
    tasks = generate_tasks(name, 200, 0)
    assert tasks == generate_tasks(name, 200, 0)
    assert tasks != generate_tasks(name, 200, 1)
    forms, counts = set(), set()
    for task in tasks:
        found = re.fullmatch(r"What is (.+)\?", task["prompt"])
        assert found is not None
        question = found.group(1)
        n = operations(question)
        assert n == task.get("max_calls", 3) and calculate(question) == str(task["answer"])
        forms.add(question.startswith("("))
        counts.add(n)
        # the scripted policy: a call per operation, each on the last one's result, an answer
        reply = script(task, single_operation=True)
        messages: list[dict[str, str]] = []
        results = []
        for _ in range(n):
            call = reply(messages)["tool_calls"][0]["function"]
            content, error = run_tool(call["name"], call["arguments"], single_operation=True)
            assert not error
            results.append(content)
            messages.append({"role": "tool", "content": content})
        assert results[-1] == str(task["answer"])
        assert reply(messages) == {
            "role": "assistant",
            "content": f"The answer is {task['answer']}.",
        }
    assert forms == {True, False}  # both question forms are drawn
    assert counts == ({3} if name == "calculator-long" else {2, 3})
