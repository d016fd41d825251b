"""`calculator`: a multi-turn tool-use episode through the official openai SDK.

The model gets a question and a `calculate` tool. Each reply with tool calls gets one `tool`
message per call, carrying the value from the safe evaluator (`tracerl.envs.expression`, never
`eval`) or `error: <why>`; the episode goes on until a reply without tool calls, which is scored
by exact answer (a wrong answer after at least one valid tool call scores `tool_use_reward`,
0 by default: shaping for models too small to get the answer before they learn the tool), or
until `max_turns` model turns, which scores 0. The assistant messages are
sent back exactly as the SDK returned them, so the gateway sees each request extend the last one
and records the whole episode as one trajectory.

Task fields: `prompt` and `answer`. `generate_tasks` makes questions with three-digit products
that a small model gets wrong without the tool.
"""

from __future__ import annotations

import random
import re
from typing import Any

from tracerl.config.envs import CalculatorEnvConfig
from tracerl.envs.base import EnvResult, Session, Task, TraceReward
from tracerl.envs.chat import Script, call_arguments, play_with_tools, tool_call
from tracerl.envs.expression import calculate
from tracerl.envs.rewards import exact_answer_reward, from_final_text

# Typed Any: the SDK's name for this TypedDict differs across the openai versions we accept.
CALCULATE_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": (
            "Evaluate an arithmetic expression with + - * / // % ** and parentheses; "
            "returns its value."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "for example (347 * 29) + 18"}
            },
            "required": ["expression"],
        },
    },
}
INSTRUCTION = "Use the calculate tool for arithmetic, then state the final answer as a number."


def generate_tasks(num_tasks: int, seed: int) -> list[Task]:
    rng = random.Random(f"tracerl.calculator:{seed}")
    tasks: list[Task] = []
    for _ in range(num_tasks):
        a, b, c = rng.randint(100, 999), rng.randint(11, 99), rng.randint(1, 99)
        if rng.random() < 0.5:
            tasks.append({"prompt": f"What is {a} * {b} + {c}?", "answer": a * b + c})
        else:
            tasks.append({"prompt": f"What is ({a} - {c}) * {b}?", "answer": (a - c) * b})
    return tasks


def run_tool(name: str, arguments: str) -> tuple[str, bool]:
    """The tool message's content for one call, and whether it was an error."""
    args = call_arguments("calculate", name, arguments)
    if isinstance(args, str):
        return args, True
    if not isinstance(args.get("expression"), str):
        return 'error: expected arguments {"expression": "<arithmetic>"}', True
    result = calculate(args["expression"])
    return result, result.startswith("error:")


def script(task: Task) -> Script:
    """The scripted policy: calculate the question's expression, then state the tool's value
    (a question it cannot read is answered from the task directly)."""
    found = re.search(r"What is (.+?)\?", str(task["prompt"]))

    def reply(messages: list[Any]) -> dict[str, Any]:
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if results:
            return {"role": "assistant", "content": f"The answer is {results[-1]}."}
        if found is None:
            return {"role": "assistant", "content": f"The answer is {task['answer']}."}
        return tool_call("calculate", {"expression": found.group(1)})

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
                content, error = run_tool(name, arguments)
            counts["calls"] += 1
            counts["errors"] += error
            return content

        prompt = f"{task['prompt']}\n{INSTRUCTION}"
        c = self.config
        play = await play_with_tools(
            session, c, prompt, [CALCULATE_TOOL], c.max_turns, answer, script(task)
        )
        calls, errors = counts["calls"], counts["errors"]
        metrics = _metrics(play.turns, calls, errors, play.turn_limit)
        if play.final_text is None:
            return EnvResult(0.0, metrics)
        reward = exact_answer_reward(task, play.final_text)
        if reward == 0.0 and calls > errors:  # shaping for small models
            reward = c.tool_use_reward
        return EnvResult(reward, metrics)


def _metrics(turns: int, tool_calls: int, tool_errors: int, turn_limit: bool) -> dict[str, float]:
    return {
        "turns": float(turns),
        "tool_calls": float(tool_calls),
        "tool_errors": float(tool_errors),
        "turn_limit": float(turn_limit),
    }
