"""A verifiers environment of the tests' own, loadable by id (`vf-tracerl-toy`) once this folder
is on the path: verifiers 0.3.1's single-turn, tool and multi-turn kinds over sums of two
numbers, each with an exact-answer rubric, a train and an eval dataset."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


def rows(first: int, count: int) -> list[dict[str, str]]:
    return [
        {"question": f"What is {a} + {a + 1}? Reply with the number.", "answer": str(2 * a + 1)}
        for a in range(first, first + count)
    ]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def exact_answer(completion: Any, answer: str, parser: vf.Parser, **_: Any) -> float:
    return float((parser.parse_answer(completion) or "").strip() == answer)


def broken(completion: Any, **_: Any) -> float:
    raise ValueError("the rubric broke")


class CheckedSum(vf.MultiTurnEnv):
    """Multi-turn: the environment says whether the reply is right; a wrong one may try again."""

    async def env_response(self, messages: Any, state: Any, **_: Any) -> Any:
        last = messages[-1]
        text = (last.content if hasattr(last, "content") else last["content"]) or ""
        if text.strip() == state["answer"]:
            state["final_env_response"] = [{"role": "user", "content": "correct"}]
            return state["final_env_response"]
        if text.strip() == "explode":
            raise vf.ToolError("the environment broke")  # recorded by verifiers as the error
        return [{"role": "user", "content": "wrong, try again"}]


def load_environment(kind: str = "single", eval_rows: bool = True, **kwargs: Any) -> Any:
    parser = vf.Parser()
    rubric = vf.Rubric(funcs=[exact_answer], weights=[1.0], parser=parser)
    data = {
        "dataset": Dataset.from_list(rows(1, 40)),
        "eval_dataset": Dataset.from_list(rows(100, 10)) if eval_rows else None,
        "parser": parser,
        "rubric": rubric,
    }
    if kind == "single":
        return vf.SingleTurnEnv(system_prompt="Answer with a number.", **data, **kwargs)
    if kind == "tool":
        return vf.ToolEnv(tools=[add], max_turns=4, **data, **kwargs)
    if kind == "multi":
        return CheckedSum(max_turns=3, **data, **kwargs)
    if kind == "broken-rubric":
        data["rubric"] = vf.Rubric(funcs=[broken], weights=[1.0], parser=parser)
        return vf.SingleTurnEnv(**data, **kwargs)
    raise ValueError(f"no kind {kind!r}")
