"""The TRL baseline of `tracerl bench learn`: TRL's `GRPOTrainer` on a task file for a wall-clock
budget, with the held-out greedy accuracy measured along the way, written to `OUTDIR/result.json`.

Runs as its own process, so TRL's imports, model load and trainer setup are charged to its budget:
the clock starts before any heavy import. Held-out evals run from a callback between optimizer
steps; their time is added back to the deadline and left out of the curve's minutes, so TRL's
curve is on training time alone (the tracerl side's evals are charged to its budget). The
accuracy before training is the orchestrator's to measure (it is the same base model for every
system); this module reports the periodic evals and one on the final weights.

The optimizer step is the unit: `--prompts-per-step` x `--group-size` completions (4 x 8 = 32)
are generated with the current weights and used for exactly one update (on-policy, no reference
model). It does not choose tasks (`learn_tasks`) or compare systems.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

STARTED_AT = time.monotonic()
"""The budget's origin, taken before torch, transformers and tracerl.envs are imported (~1.5 s
here); trl is imported when training starts."""

import torch  # noqa: E402  (charged to the budget, so imported after STARTED_AT)
from transformers import (  # noqa: E402
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from tracerl.bench.learn_tasks import (  # noqa: E402
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MODEL,
    greedy_accuracy,
    load_policy,
)
from tracerl.envs.dataset import read_jsonl  # noqa: E402
from tracerl.envs.rewards import exact_answer_reward  # noqa: E402

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from trl import GRPOConfig

# A step never ends on its own once training runs: the deadline callback stops it.
MAX_STEPS = 100_000


def exact_answer(
    completions: list[list[dict[str, str]]], answer: list[int], **_: Any
) -> list[float | None]:
    """TRL reward function: `exact_answer_reward` on each conversational completion's text
    (TRL passes the dataset's `answer` column alongside, one entry per completion). Typed as
    TRL's `RewardFunc`, whose entries may be None for "not applicable"; these never are."""
    return [
        exact_answer_reward({"answer": a}, c[-1]["content"])
        for c, a in zip(completions, answer, strict=True)
    ]


def grpo_config(args: argparse.Namespace) -> GRPOConfig:
    """The baseline's GRPO settings: one on-policy DAPO update per generated batch, no KL."""
    from trl import GRPOConfig

    completions = args.prompts_per_step * args.group_size
    schedule: dict[str, Any] = {"lr_scheduler_type": "constant", "max_steps": MAX_STEPS}
    if args.schedule == "cosine":  # tracerl's `cosine` shape: to min_lr_ratio x lr, no warmup
        if not args.total_steps:
            raise SystemExit("--schedule cosine needs --total-steps (the steps it decays over)")
        schedule = {
            "lr_scheduler_type": "cosine_with_min_lr",
            "lr_scheduler_kwargs": {"min_lr_rate": args.min_lr_ratio},
            "max_steps": args.total_steps,  # HF's schedulers span max_steps; the run ends there
        }
    return GRPOConfig(
        output_dir=str(args.out),
        # One generation batch of `completions` feeds exactly one optimizer step: TRL counts
        # `per_device_train_batch_size` in completions, and with one accumulation step
        # `steps_per_generation` defaults to 1, so `generation_batch_size` = `completions`.
        per_device_train_batch_size=completions,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        loss_type="dapo",
        beta=0.0,
        learning_rate=args.lr,
        warmup_steps=0,
        **schedule,
        seed=args.seed,
        use_cpu=True,
        # TRL's own defaults, its fastest configuration on a CPU with bf16 arithmetic (measured,
        # docs/benchmarks.md): bf16 autocast over the float32 weights, and activation
        # checkpointing. With bf16 off and checkpointing off (this harness before), a step took
        # 22-28 s; with both on, 15 s. Where the CPU lacks it, bf16 is emulated and slower.
        bf16=precision(args.precision) == "bf16",
        activation_checkpointing=args.checkpointing,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
    )


def native_bf16() -> bool:
    """Whether this CPU computes in bf16 itself (AVX512-BF16 or AMX): without either, torch
    emulates it, and a bf16 matmul here (AVX2 only) took 7x a float32 one."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def precision(asked: str) -> str:
    """`--precision`: "auto" is bf16 where the CPU computes it natively, float32 elsewhere."""
    if asked == "auto":
        return "bf16" if native_bf16() else "fp32"
    return asked


class BudgetCallback(TrainerCallback):
    """Stops training once the budget is spent and runs the periodic held-out evals.

    Budget time is wall time since `STARTED_AT` minus the time spent in evals; a stop is
    checked at each step's end, so the last step may overrun the budget by up to one step."""

    def __init__(
        self,
        minutes: float,
        eval_every_min: float,
        measure: Callable[[PreTrainedModel, float], Any],
    ) -> None:
        """`measure(model, minutes)`: what a periodic eval records at that budget time (an
        accuracy, or where a snapshot of the weights went, for the judge to score later)."""
        self.budget_s = minutes * 60
        self.eval_every_s = eval_every_min * 60
        self.next_eval_s = self.eval_every_s
        self.measure = measure
        self.eval_s = 0.0
        self.load_s = 0.0
        self.step_started = 0.0
        self.curve: list[list[Any]] = []
        self.train_reward: list[float] = []
        self.step_times_s: list[float] = []

    def budget_used_s(self) -> float:
        """Seconds of the budget spent so far (wall time since start, evals excluded)."""
        return time.monotonic() - STARTED_AT - self.eval_s

    def evaluate(self, model: PreTrainedModel) -> None:
        """Append `measure`'s value at the current budget time, not charging its time."""
        minutes = self.budget_used_s() / 60
        began = time.monotonic()
        value = self.measure(model, minutes)
        self.eval_s += time.monotonic() - began
        self.curve.append([round(minutes, 3), value])
        log(f"eval at {minutes:.2f} min: {value}")

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.load_s = time.monotonic() - STARTED_AT

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.step_started = time.monotonic()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.step_times_s.append(time.monotonic() - self.step_started)
        used = self.budget_used_s()
        if used >= self.budget_s:
            control.should_training_stop = True
        elif used >= self.next_eval_s:
            self.evaluate(kwargs["model"])
            while self.next_eval_s <= used:
                self.next_eval_s += self.eval_every_s

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs and "reward" in logs:
            self.train_reward.append(float(logs["reward"]))
            log(
                f"step {state.global_step}: reward {logs['reward']:.3f} "
                f"({self.step_times_s[-1]:.1f} s, budget used {self.budget_used_s() / 60:.2f} min)"
            )


def log(message: str) -> None:
    """Progress to stderr: stdout carries only the result line."""
    print(message, file=sys.stderr, flush=True)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Load the model, run GRPO until the budget is spent, evaluate the final weights."""
    from datasets import Dataset
    from trl import GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    heldout = read_jsonl(args.heldout, ("prompt", "answer"))
    rows = [
        {"prompt": [{"role": "user", "content": t["prompt"]}], "answer": t["answer"]}
        for t in read_jsonl(args.train, ("prompt", "answer"))
    ]
    model, tokenizer = load_policy(args.model)
    budget = BudgetCallback(
        args.minutes,
        args.eval_every_min,
        lambda m, _: greedy_accuracy(m, tokenizer, heldout, args.max_new_tokens),
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact_answer,
        args=grpo_config(args),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[budget],
    )
    result = run(trainer, model, budget, args)
    result.update(accuracy_after=result["curve"][-1][1])
    return result


def run(
    trainer: Any, model: PreTrainedModel, budget: BudgetCallback, args: argparse.Namespace
) -> dict[str, Any]:
    """Train until the budget stops it, measure the final weights; the result's common part."""
    from transformers import PrinterCallback

    # With tqdm off, transformers prints every log dict to stdout, which carries only the result.
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    budget.evaluate(model)
    return {
        "system": "trl",
        "seed": args.seed,
        "steps": trainer.state.global_step,
        "minutes": args.minutes,
        "curve": budget.curve,
        "train_reward": budget.train_reward,
        "step_times_s": [round(s, 3) for s in budget.step_times_s],
        "load_s": round(budget.load_s, 3),
        "eval_s": round(budget.eval_s, 3),
        "precision": precision(args.precision),
    }


def add_arguments(parser: argparse.ArgumentParser, group_size: int, max_new_tokens: int) -> None:
    """The arguments both TRL harnesses take (the run's budget, batch, and TRL's settings)."""
    parser.add_argument("--train", type=Path, required=True, help="train tasks (JSONL)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--minutes", type=float, required=True, help="wall-clock budget")
    parser.add_argument("--out", type=Path, required=True, help="directory for result.json")
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=group_size, help="samples per prompt")
    parser.add_argument(
        "--max-new-tokens", type=int, default=max_new_tokens,
        help="TRL's max_completion_length (an agentic episode's, tool answers included)",
    )  # fmt: skip
    parser.add_argument("--eval-every-min", type=float, default=5.0, help="budget minutes")
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="rollout sampling temperature"
    )
    parser.add_argument(
        "--schedule", choices=("constant", "cosine"), default="constant",
        help="the lr schedule; cosine decays to --min-lr-ratio x --lr over --total-steps, "
        "where training stops (tracerl's trainer.actor.schedule = 'cosine')",
    )  # fmt: skip
    parser.add_argument("--total-steps", type=int, default=None)
    parser.add_argument("--min-lr-ratio", type=float, default=0.1)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument(
        "--precision", choices=("auto", "bf16", "fp32"), default="auto",
        help="bf16: TRL's default autocast over float32 weights; fp32: none; auto (default): "
        "bf16 where the CPU computes bf16 natively (AVX512-BF16, AMX), else fp32",
    )  # fmt: skip
    parser.add_argument(
        "--checkpointing", action=argparse.BooleanOptionalAction, default=True,
        help="activation checkpointing (TRL's default: on)",
    )  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tracerl.bench.learn_trl", description=__doc__)
    add_arguments(parser, group_size=8, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--heldout", type=Path, required=True, help="held-out tasks (JSONL)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="built-in name or HF directory")
    return parser.parse_args(argv)


def write_result(args: argparse.Namespace, result: dict[str, Any]) -> int:
    """`OUTDIR/result.json`, and the same JSON line on stdout."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result) + "\n")
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Train, write `OUTDIR/result.json` and print it as one JSON line."""
    args = parse(argv)
    return write_result(args, train(args))


if __name__ == "__main__":
    raise SystemExit(main())
