"""`calculator`: a multi-turn tool-use episode through the official openai SDK.

The model gets a question and a `calculate` tool. Each reply with tool calls gets one `tool`
message per call, carrying the value from the safe evaluator (`tracerl.envs.expression`, never
`eval`) or `error: <why>`; the episode goes on until a reply without tool calls, which is scored
by exact answer (a wrong answer after at least one valid tool call scores `tool_use_reward`,
0 by default: shaping for models too small to get the answer before they learn the tool), or
until `max_turns` model turns, which scores 0. The assistant messages are
sent back exactly as the SDK returned them, so the gateway sees each request extend the last one
and records the whole episode as one trajectory.

Task fields: `prompt` and `answer`, and optionally `max_calls`: an episode that made more tool
calls than that scores 0 whatever it answers. `generate_tasks` makes questions of two operations
with three-digit products that a small model gets wrong without the tool; `generate_long_tasks`
(task set `calculator-long`) the same with a third operation; `generate_mixed_tasks`
(`calculator-mixed`) either, with `max_calls` their number of operations. With `single_operation`
the tool computes one operation per call, so a question takes one call per operation, each on
the last one's result: credit spread over three (four) model turns
(`envs.expression.next_operation` is how the scripted policy works it out).
"""

from __future__ import annotations

import random
import re
from typing import Any

from tracerl.config.envs import CalculatorEnvConfig
from tracerl.envs.base import EnvResult, Session, Task, TraceReward
from tracerl.envs.chat import Script, call_arguments, function_tool, play_with_tools, tool_call
from tracerl.envs.expression import calculate, next_operation, operations
from tracerl.envs.rewards import exact_answer_reward, from_final_text


def _calculate_tool(description: str, example: str) -> Any:
    """The `calculate` tool's definition, described as one of the calculator's two forms."""
    return function_tool("calculate", description, "expression", "string", f"for example {example}")


CALCULATE_TOOL: Any = _calculate_tool(
    "Evaluate an arithmetic expression with + - * / // % ** and parentheses; returns its value.",
    "(347 * 29) + 18",
)
# `single_operation`: the same tool, one operation per call.
SINGLE_OPERATION_TOOL: Any = _calculate_tool(
    "Compute one operation on two numbers: + - * / // % or **; returns its value. "
    "Work out a longer expression one operation at a time.",
    "347 * 29",
)
INSTRUCTION = "Use the calculate tool for arithmetic, then state the final answer as a number."
ONE_OPERATION_ERROR = "error: one operation per call, for example 347 * 29"


def _question(rng: random.Random, operations: int) -> Task:
    """A question of two or three operations on a three-digit number, in one of two forms."""
    a, b, c = rng.randint(100, 999), rng.randint(11, 99), rng.randint(1, 99)
    if operations == 2:
        if rng.random() < 0.5:
            return {"prompt": f"What is {a} * {b} + {c}?", "answer": a * b + c}
        return {"prompt": f"What is ({a} - {c}) * {b}?", "answer": (a - c) * b}
    d = rng.randint(1, 99)
    if rng.random() < 0.5:
        return {"prompt": f"What is {a} * {b} + {c} - {d}?", "answer": a * b + c - d}
    return {"prompt": f"What is ({a} - {c}) * {b} + {d}?", "answer": (a - c) * b + d}


def generate_tasks(num_tasks: int, seed: int) -> list[Task]:
    rng = random.Random(f"tracerl.calculator:{seed}")
    return [_question(rng, 2) for _ in range(num_tasks)]


def generate_long_tasks(num_tasks: int, seed: int) -> list[Task]:
    """Questions of three operations: with `single_operation`, three dependent calls and an
    answer, so a policy must carry each result into the next call and stop after the third."""
    rng = random.Random(f"tracerl.calculator-long:{seed}")
    return [_question(rng, 3) for _ in range(num_tasks)]


def generate_mixed_tasks(num_tasks: int, seed: int) -> list[Task]:
    """Questions of two or three operations, half each, with `max_calls` their number of
    operations: with `single_operation` (one call per operation) an answer counts only after
    no more calls than the question needs, so when to stop depends on the question (a third
    call on a two-operation question that repeats the second would otherwise still end right)."""
    rng = random.Random(f"tracerl.calculator-mixed:{seed}")
    tasks: list[Task] = []
    for _ in range(num_tasks):
        operations = rng.choice((2, 3))
        tasks.append({**_question(rng, operations), "max_calls": operations})
    return tasks


def run_tool(name: str, arguments: str, single_operation: bool = False) -> tuple[str, bool]:
    """The tool message's content for one call, and whether it was an error."""
    args = call_arguments("calculate", name, arguments)
    if isinstance(args, str):
        return args, True
    expression = args.get("expression")
    if not isinstance(expression, str):
        return 'error: expected arguments {"expression": "<arithmetic>"}', True
    if single_operation and operations(expression) > 1:
        return ONE_OPERATION_ERROR, True
    result = calculate(expression)
    return result, result.startswith("error:")


def script(task: Task, single_operation: bool = False) -> Script:
    """The scripted policy: calculate the question's expression (one operation per call with
    `single_operation`, left to right in the order of evaluation, each on the results so far),
    then state the value. A question it cannot read is answered from the task directly."""
    found = re.search(r"What is (.+?)\?", str(task["prompt"]))
    steps: list[str] = []
    if found is not None:
        if single_operation:
            expression = found.group(1)
            while (step := next_operation(expression)) is not None:
                steps.append(step[0])
                expression = step[1]
        else:
            steps.append(found.group(1))

    def reply(messages: list[Any]) -> dict[str, Any]:
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if len(results) < len(steps):
            return tool_call("calculate", {"expression": steps[len(results)]})
        answer = results[-1] if results else task["answer"]
        return {"role": "assistant", "content": f"The answer is {answer}."}

    return reply


class CalculatorEnvironment:
    name = "calculator"
    demonstrable = True  # `script` plays it in demonstration sessions
    task_fields: tuple[str, ...] = ("prompt", "answer")

    def __init__(self, config: CalculatorEnvConfig) -> None:
        self.config = config
        self.reward_fn: TraceReward | None = from_final_text(exact_answer_reward)

    async def run(self, task: Task, session: Session) -> EnvResult:
        counts = {"calls": 0, "errors": 0}

        def answer(name: str | None, arguments: str) -> str:
            if name is None:
                content, error = "error: only function tools are supported", True
            else:
                content, error = run_tool(name, arguments, self.config.single_operation)
            counts["calls"] += 1
            counts["errors"] += error
            return content

        prompt = f"{task['prompt']}\n{INSTRUCTION}"
        c = self.config
        tool = SINGLE_OPERATION_TOOL if c.single_operation else CALCULATE_TOOL
        play = await play_with_tools(
            session, c, prompt, [tool], c.max_turns, answer, script(task, c.single_operation)
        )
        calls, errors = counts["calls"], counts["errors"]
        metrics = _metrics(play.turns, calls, errors, play.turn_limit)
        if play.final_text is None or over_calls(task, calls):
            return EnvResult(0.0, metrics)
        reward = exact_answer_reward(task, play.final_text)
        if reward == 0.0 and calls > errors:  # shaping for small models
            reward = c.tool_use_reward
        return EnvResult(reward, metrics)


def over_calls(task: Task, calls: int) -> bool:
    """Whether an episode made more tool calls than the task's `max_calls`, if it has one: its
    answer then scores 0, right or not (no shaping either)."""
    return "max_calls" in task and calls > int(task["max_calls"])


def _metrics(turns: int, tool_calls: int, tool_errors: int, turn_limit: bool) -> dict[str, float]:
    return {
        "turns": float(turns),
        "tool_calls": float(tool_calls),
        "tool_errors": float(tool_errors),
        "turn_limit": float(turn_limit),
    }
