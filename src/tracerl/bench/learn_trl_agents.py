"""The TRL baseline of `tracerl bench learn`'s agentic tasks: TRL's `GRPOTrainer` with `tools=`
(`calculator`, `calculator-long`, `calculator-mixed`) or `environment_factory` (`guess`,
`files`), from the start checkpoint, for a wall-clock budget; snapshots of the weights along
the way for the shared judge; `OUTDIR/result.json`.

Runs as its own process: the budget starts when `learn_trl` is imported, before torch (as in the
single-turn baseline), and the periodic snapshots are not charged to it. The environments are
tracerl's own (`envs.calculator`, `envs.guess`, `envs.files`): the same tool answers, errors
and scoring, so the two systems see the same task; what differs is how each trainer runs an
episode.

- Prompts: the user message tracerl's environment sends, with its tool rendered by the same
  `chatml` template. The harness checks that TRL's tool schema (built by transformers from the
  function's signature and docstring) renders exactly as tracerl's tool does, and stops if not.
- Turns: at most `--max-turns` model turns (`max_tool_calling_iterations` = turns - 1) of at most
  `--max-tokens-per-turn` tokens each (`generation_kwargs`); TRL's `max_completion_length`, which
  counts the whole episode with its tool answers, is set above what those allow.
- Tool calls are parsed by TRL with its own Qwen3 response template (`trl.chat_template_utils.
  qwen3_template`), which reads the Hermes `<tool_call>` blocks `chatml` writes; TRL recognises
  no template of its own for chatml. Tool answers are masked out of the loss by TRL.
- Rewards: `calculator` and `files`, the exact answer of a last reply that calls no tool (an
  episode whose turns ran out still calling scores 0, as in tracerl), on `calculator-mixed`
  only within the question's `max_calls` tool calls (as in tracerl); `guess`, 1 once a guess
  found the number or the last reply states it. Unlike tracerl's environment, TRL cannot end an
  episode from a tool, so after a correct guess the model takes one more turn (not scored).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tracerl.bench import learn_trl  # the first heavy import: its STARTED_AT starts the budget
from tracerl.envs.calculator import INSTRUCTION, SINGLE_OPERATION_TOOL, over_calls, run_tool
from tracerl.envs.dataset import read_jsonl
from tracerl.envs.files import LIST_TOOL, READ_TOOL, answer_call
from tracerl.envs.guess import GUESS_TOOL, answer_guess
from tracerl.envs.rewards import exact_answer_reward


def _docstring(tool: dict[str, Any]) -> str:
    """A Google-style docstring from which transformers' `get_json_schema` builds `tool` again."""
    function = tool["function"]
    args = "".join(
        f"\n    {name}: {spec['description']}"
        for name, spec in function["parameters"]["properties"].items()
    )
    return f"{function['description']}\n\nArgs:{args}\n"


def calculate(expression: str) -> str:
    # the single-operation calculator's tool, answered by tracerl's own code
    return run_tool("calculate", json.dumps({"expression": expression}), True)[0]


def _as_tool(function: Any, tool: dict[str, Any]) -> None:
    """Make transformers' schema of `function` equal `tool`: its docstring, and no return type
    (which transformers would list and tracerl's tools do not)."""
    function.__doc__ = _docstring(tool)
    function.__annotations__.pop("return", None)


_as_tool(calculate, SINGLE_OPERATION_TOOL)


class GuessGame:
    """One game for `environment_factory`: `guess` is its tool, answered by tracerl's own code."""

    def __init__(self) -> None:
        self.task: dict[str, Any] = {}
        self.found = False

    def reset(self, answer: int, high: int, **_: Any) -> None:
        """A new game; None keeps the prompt as it is."""
        self.task, self.found = {"answer": answer, "high": high}, False

    def guess(self, number: int) -> str:
        content, found = answer_guess(self.task, "guess", json.dumps({"number": number}))
        self.found = self.found or bool(found)
        return content


_as_tool(GuessGame.guess, GUESS_TOOL)


class FileSystem:
    """One task's file system for `environment_factory`: `list_files` and `read_file` are its
    tools (TRL lists them in that order, as tracerl does), answered by tracerl's own code."""

    def __init__(self) -> None:
        self.task: dict[str, Any] = {}

    def reset(self, files: list[dict[str, str]], **_: Any) -> None:
        """A new task; None keeps the prompt as it is."""
        self.task = {"files": files}

    def list_files(self, path: str) -> str:
        return answer_call(self.task, "list_files", json.dumps({"path": path}))[0]

    def read_file(self, path: str) -> str:
        return answer_call(self.task, "read_file", json.dumps({"path": path}))[0]


_as_tool(FileSystem.list_files, LIST_TOOL)
_as_tool(FileSystem.read_file, READ_TOOL)


def _final_text(messages: list[dict[str, Any]]) -> str | None:
    """The last reply's text when it calls no tool; None when the turns ran out mid-calls."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    return str(last.get("content") or "")


def final_answer_reward(
    completions: list[list[dict[str, Any]]], answer: list[int], **_: Any
) -> list[float | None]:
    out: list[float | None] = []
    for messages, a in zip(completions, answer, strict=True):
        text = _final_text(messages)
        out.append(0.0 if text is None else exact_answer_reward({"answer": a}, text))
    return out


def calls_answer_reward(
    completions: list[list[dict[str, Any]]], answer: list[int], max_calls: list[int], **_: Any
) -> list[float | None]:
    """`final_answer_reward`, and 0 after more tool calls than the task's `max_calls`."""
    out = final_answer_reward(completions, answer)
    for i, (messages, limit) in enumerate(zip(completions, max_calls, strict=True)):
        calls = sum(len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant")
        if over_calls({"max_calls": limit}, calls):
            out[i] = 0.0
    return out


def guess_reward(
    completions: list[list[dict[str, Any]]],
    answer: list[int],
    environments: list[GuessGame],
    **_: Any,
) -> list[float | None]:
    out: list[float | None] = []
    for messages, a, game in zip(completions, answer, environments, strict=True):
        text = _final_text(messages)
        stated = text is not None and exact_answer_reward({"answer": a}, text) == 1.0
        out.append(float(game.found or stated))
    return out


class TaskSide(NamedTuple):
    """What TRL's side of one task is made of."""

    tools: list[dict[str, Any]]
    """tracerl's tools, in order"""
    functions: list[Any]
    """the functions TRL builds its tool schemas from, in the same order"""
    reward: Callable[..., list[float | None]]
    environment: type | None = None
    """the `environment_factory` class (None: `tools=` the functions, stateless)"""
    columns: tuple[str, ...] = ()
    """the task fields TRL's dataset carries besides the answer: what the environment's
    `reset` reads, what the reward reads"""
    suffix: str = ""
    """what tracerl's environment appends to the task's prompt"""


CALCULATOR = TaskSide(
    [SINGLE_OPERATION_TOOL], [calculate], final_answer_reward, suffix=f"\n{INSTRUCTION}"
)
TASKS: dict[str, TaskSide] = {
    "calculator": CALCULATOR,
    "calculator-long": CALCULATOR,  # the same tool, questions of three operations
    # two or three operations, an answer scored only within the question's number of calls
    "calculator-mixed": CALCULATOR._replace(reward=calls_answer_reward, columns=("max_calls",)),
    "guess": TaskSide([GUESS_TOOL], [GuessGame.guess], guess_reward, GuessGame, ("high",)),
    "files": TaskSide(
        [LIST_TOOL, READ_TOOL],
        [FileSystem.list_files, FileSystem.read_file],
        final_answer_reward,
        FileSystem,
        ("files",),
    ),
}


def check_same_prompt(tokenizer: Any, task: str, first_prompt: list[dict[str, str]]) -> None:
    """Stop unless TRL's tool schema renders exactly as tracerl's tool (same prompt tokens)."""
    from transformers.utils import get_json_schema

    ours, functions = TASKS[task].tools, TASKS[task].functions
    theirs = [get_json_schema(f) for f in functions]
    render = [
        tokenizer.apply_chat_template(
            first_prompt, tools=tools, tokenize=False, add_generation_prompt=True
        )
        for tools in (ours, theirs)
    ]
    if render[0] != render[1]:
        raise SystemExit(
            f"learn_trl_agents: TRL's prompt differs from tracerl's:\n{render[1]}\n---\n{render[0]}"
        )


def dataset_rows(side: TaskSide, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TRL's dataset: per task, the user message tracerl's environment sends, the answer the
    reward reads, and the side's other `columns`."""
    return [
        {
            "prompt": [{"role": "user", "content": f"{t['prompt']}{side.suffix}"}],
            "answer": t["answer"],
            **{column: t[column] for column in side.columns},
        }
        for t in tasks
    ]


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Load the start checkpoint, run GRPO until the budget is spent, snapshot the weights."""
    from datasets import Dataset
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from tracerl.bench.learn_tasks import load_policy
    from tracerl.chat_templates import read_template

    if args.threads:
        learn_trl.torch.set_num_threads(args.threads)
    side = TASKS[args.task]
    rows = dataset_rows(side, read_jsonl(args.train, ("prompt", "answer")))
    model, tokenizer = load_policy(str(args.model))
    tokenizer.chat_template = read_template("chatml")
    tokenizer.response_template = qwen3_template  # how TRL reads the calls back
    check_same_prompt(tokenizer, args.task, rows[0]["prompt"])
    snapshots = args.out / "snapshots"

    def snapshot(m: Any, minutes: float) -> str:
        path = snapshots / f"{minutes:07.3f}"
        m.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return str(path)

    budget = learn_trl.BudgetCallback(args.minutes, args.eval_every_min, snapshot)
    config = learn_trl.grpo_config(args)
    config.max_tool_calling_iterations = args.max_turns - 1
    config.generation_kwargs = {"max_new_tokens": args.max_tokens_per_turn}
    tools: dict[str, Any] = (
        {"environment_factory": side.environment} if side.environment else {"tools": side.functions}
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=side.reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[budget],
        **tools,
    )
    result = learn_trl.run(trainer, model, budget, args)
    result["snapshots"] = result.pop("curve")
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tracerl.bench.learn_trl_agents", description=__doc__
    )
    learn_trl.add_arguments(parser, group_size=4, max_new_tokens=1024)
    parser.add_argument("--task", choices=tuple(TASKS), required=True)
    parser.add_argument("--model", type=Path, required=True, help="the start checkpoint")
    parser.add_argument("--max-turns", type=int, required=True, help="model turns per episode")
    parser.add_argument("--max-tokens-per-turn", type=int, default=64)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, write `OUTDIR/result.json` and print it as one JSON line."""
    args = parse(argv)
    return learn_trl.write_result(args, train(args))


if __name__ == "__main__":
    raise SystemExit(main())
