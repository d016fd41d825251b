"""`arithmetic`: one question, one reply, reward 1 for the exact answer (the last number in the
reply, or the one inside `\\boxed{}` / `<answer>`), else 0.

Task fields: `prompt` (the question as sent) and `answer` (an int, float or numeric string).
`generate_tasks(n, seed)` makes `n` questions over + - * with small operands, the same for the
same seed on every machine.
"""

from __future__ import annotations

import random

from tracerl.config.envs import ArithmeticEnvConfig
from tracerl.envs.base import Task
from tracerl.envs.chat import SingleTurnEnvironment
from tracerl.envs.rewards import exact_answer_reward

# Operand ranges per operator: sums and differences of two-digit numbers, small products, so
# a small instruct model answers some but not all correctly.
_OPERANDS = {"+": (0, 99), "-": (0, 99), "*": (2, 19)}


def generate_tasks(num_tasks: int, seed: int) -> list[Task]:
    rng = random.Random(f"tracerl.arithmetic:{seed}")
    tasks: list[Task] = []
    for _ in range(num_tasks):
        op = rng.choice(sorted(_OPERANDS))
        low, high = _OPERANDS[op]
        a, b = rng.randint(low, high), rng.randint(low, high)
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        tasks.append({"prompt": f"What is {a} {op} {b}?", "answer": answer})
    return tasks


class ArithmeticEnvironment(SingleTurnEnvironment):
    name = "arithmetic"
    task_fields = ("prompt", "answer")

    def __init__(self, config: ArithmeticEnvConfig) -> None:
        super().__init__(config, exact_answer_reward)
