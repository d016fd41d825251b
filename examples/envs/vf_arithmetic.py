"""A verifiers environment (verifiers 0.3.1's API) for examples/envs/verifiers.toml: sums and
products of small numbers, single-turn, rewarded by an exact-answer rubric. The run loads it by
id (`vf-arithmetic`) like any installed verifiers environment: this folder is on PYTHONPATH.
  PYTHONPATH=examples/envs tracerl train examples/envs/verifiers.toml"""

from __future__ import annotations

import random
import re
from typing import Any

import verifiers as vf
from datasets import Dataset


def rows(count: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b, op = rng.randint(2, 30), rng.randint(2, 30), rng.choice("+-*")
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        out.append({"question": f"What is {a} {op} {b}?", "answer": str(answer)})
    return out


def exact_answer(completion: Any, answer: str, parser: vf.Parser, **_: Any) -> float:
    """1 when the reply's last number is the answer."""
    numbers = re.findall(r"-?\d+", parser.parse_answer(completion) or "")
    return float(bool(numbers) and numbers[-1] == answer)


def load_environment(num_train: int = 2000, num_eval: int = 100, **kwargs: Any) -> Any:
    parser = vf.Parser()
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows(num_train, 0)),
        eval_dataset=Dataset.from_list(rows(num_eval, 1)),
        system_prompt="Answer with the number only.",
        parser=parser,
        rubric=vf.Rubric(funcs=[exact_answer], weights=[1.0], parser=parser),
        **kwargs,
    )
