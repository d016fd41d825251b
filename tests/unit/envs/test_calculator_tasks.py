"""The calculator's generated questions: the two-operation set the benchmarks were measured on
stays as it was, and `calculator-long`'s questions take three dependent one-operation calls."""

from __future__ import annotations

import re

from tracerl.envs.calculator import run_tool, script
from tracerl.envs.expression import calculate, operations
from tracerl.envs.registry import generate_tasks


def test_the_two_operation_questions_are_the_ones_measured() -> None:
    # the first two of `bench learn`'s calculator train set (seed 0) in docs/benchmarks.md
    assert generate_tasks("calculator", 2, 0) == [
        {"prompt": "What is 784 * 20 + 48?", "answer": 15728},
        {"prompt": "What is (176 - 92) * 67?", "answer": 5628},
    ]


def test_long_questions_take_three_dependent_calls_and_an_answer() -> None:
    tasks = generate_tasks("calculator-long", 200, 0)
    assert tasks == generate_tasks("calculator-long", 200, 0)
    assert tasks != generate_tasks("calculator-long", 200, 1)
    forms = set()
    for task in tasks:
        found = re.fullmatch(r"What is (.+)\?", task["prompt"])
        assert found is not None
        question = found.group(1)
        assert operations(question) == 3 and calculate(question) == str(task["answer"])
        forms.add(question.startswith("("))
        # the scripted policy: three calls, each on the last one's result, then the answer
        reply = script(task, single_operation=True)
        messages: list[dict[str, str]] = []
        results = []
        for _ in range(3):
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
