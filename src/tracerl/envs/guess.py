"""`guess`: a stateful multi-turn game through the official openai SDK, where what the agent sees
next depends on what it did.

The model is to find a hidden whole number from 1 to `high` with a `guess` tool, which answers
`higher`, `lower` or `correct`. A correct guess ends the episode with reward 1 (no model turn
follows it); so does a reply without tool calls whose final answer is the number (the
episode's last word, scored like `arithmetic`'s). Anything else, or `max_turns` model turns
without finding it, scores 0. Every call counts as a guess; an invalid one (not a `guess`, not
a whole number, out of range) is answered `error: ...` and costs its turn. A binary search
finds the number in at most ceil(log2(high + 1)) guesses, so `max_turns` sets how much wandering
the task forgives.

The assistant messages go back exactly as the SDK returned them, so the gateway records the
episode as one trajectory whose tool answers are context only (never in the loss).

Task fields: `prompt`, `answer` (the number) and `high`. `generate_tasks` draws `high` from 8,
16 and 32 and the number uniformly below it; held-out sets are other seeds.
"""

from __future__ import annotations

import json
import random
from typing import Any

from tracerl.config.envs import GuessEnvConfig
from tracerl.envs.base import EnvResult, Session, Task
from tracerl.envs.chat import Script, call_arguments, function_tool, play_with_tools, tool_call
from tracerl.envs.rewards import exact_answer_reward, final_text
from tracerl.trace.schema import SessionTrace, Turn

GUESS_TOOL: Any = function_tool(
    "guess",
    "Guess the hidden number; answers higher, lower or correct.",
    "number",
    "integer",
    "your guess",
)
HIGHS = (8, 16, 32)


def prompt_for(high: int) -> str:
    return (
        f"I am thinking of a whole number from 1 to {high}. Find it with the guess tool: it "
        "answers higher, lower or correct."
    )


def generate_tasks(num_tasks: int, seed: int) -> list[Task]:
    rng = random.Random(f"tracerl.guess:{seed}")
    tasks: list[Task] = []
    for _ in range(num_tasks):
        high = rng.choice(HIGHS)
        tasks.append({"prompt": prompt_for(high), "answer": rng.randint(1, high), "high": high})
    return tasks


def answer_guess(task: Task, name: str, arguments: str) -> tuple[str, bool | None]:
    """The tool's answer to one call, and whether it found the number (None: invalid)."""
    args = call_arguments("guess", name, arguments)
    if isinstance(args, str):
        return args, None
    number = args.get("number")
    if isinstance(number, str) and number.strip().lstrip("-").isdigit():
        number = int(number)  # small models quote numbers; the value is still a guess
    if not isinstance(number, int) or isinstance(number, bool):
        return 'error: expected arguments {"number": <a whole number>}', None
    high = int(task.get("high", 0)) or max(HIGHS)
    if not 1 <= number <= high:
        return f"error: the number is from 1 to {high}", None
    answer = int(task["answer"])
    if number == answer:
        return f"correct: the number is {answer}", True
    return ("higher" if answer > number else "lower"), False


def script(task: Task) -> Script:
    """The scripted policy: a binary search, narrowed by each answer so far."""
    high = int(task.get("high", 0)) or max(HIGHS)

    def reply(messages: list[Any]) -> dict[str, Any]:
        lo, hi, guessed = 1, high, 0
        for m in messages:
            if m["role"] == "assistant" and m.get("tool_calls"):
                guessed = json.loads(m["tool_calls"][0]["function"]["arguments"])["number"]
            elif m["role"] == "tool" and m["content"] in ("higher", "lower"):
                lo, hi = (guessed + 1, hi) if m["content"] == "higher" else (lo, guessed - 1)
        return tool_call("guess", {"number": (lo + hi) // 2})

    return reply


class GuessEnvironment:
    name = "guess"
    demonstrable = True  # `script` plays it in demonstration sessions
    task_fields: tuple[str, ...] = ("prompt", "answer")

    def __init__(self, config: GuessEnvConfig) -> None:
        self.config = config
        self.reward_fn = trace_reward

    async def run(self, task: Task, session: Session) -> EnvResult:
        counts = {"guesses": 0, "invalid": 0, "found": 0}

        def answer(name: str | None, arguments: str) -> str | None:
            counts["guesses"] += 1
            if name is None:
                content, found = "error: only function tools are supported", None
            else:
                content, found = answer_guess(task, name, arguments)
            counts["invalid"] += found is None
            counts["found"] += bool(found)
            return None if found else content  # a correct guess ends the episode

        c = self.config
        play = await play_with_tools(
            session, c, task["prompt"], [GUESS_TOOL], c.max_turns, answer, script(task)
        )
        solved = counts["found"] > 0
        if play.final_text is not None:
            solved = exact_answer_reward(task, play.final_text) == 1.0
        metrics = {
            "turns": float(play.turns),
            "guesses": float(counts["guesses"]),
            "invalid_guesses": float(counts["invalid"]),
            "solved": float(solved),
        }
        return EnvResult(float(solved), metrics)


def _guesses(turn: Turn) -> list[str]:
    """The arguments (JSON text) of the `guess` calls in a turn's recorded response, whichever
    API it came through."""
    r = turn.response
    if turn.endpoint == "chat.completions":
        calls = r["choices"][0]["message"].get("tool_calls") or []
        return [c["function"]["arguments"] for c in calls if c["function"]["name"] == "guess"]
    if turn.endpoint == "responses":
        items = r.get("output") or []
        return [
            i["arguments"]
            for i in items
            if i.get("type") == "function_call" and i["name"] == "guess"
        ]
    blocks = r.get("content") or []
    return [
        json.dumps(b["input"])
        for b in blocks
        if b.get("type") == "tool_use" and b["name"] == "guess"
    ]


def trace_reward(task: Task, trace: SessionTrace) -> float:
    """The game's reward read from a recorded episode: 1.0 when any `guess` call found the
    number or the last reply's final answer is it (an agent of its own played the game)."""
    for turn in trace.turns:
        if any(answer_guess(task, "guess", args)[1] for args in _guesses(turn)):
            return 1.0
    return exact_answer_reward(task, final_text(trace)) if trace.turns else 0.0
