"""Tasks for `tracerl bench learn`: two-operand sums the untrained model mostly fails, and how
well a model answers them (greedy accuracy, per-sample pass rate at a temperature).

Owns the task generators (deterministic for a seed on every machine), the train / held-out split
(no held-out prompt text ever appears in train), and the two scoring loops over plain HF
`generate`. Scoring uses `exact_answer_reward` (the last number in the reply), the same reward
the trainers optimise. It does not train: `learn_trl` (the TRL baseline) and the tracerl side
import it. torch is imported only inside the scoring functions, so generating tasks is cheap.

Difficulty was set by measuring SmolLM2-135M-Instruct's greedy pass rate on 200 held-out prompts
(12 new tokens): `hard` at most 2 %, `medium` within 5-30 %; see `LEARN_TASKS`.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracerl.envs.base import Task
from tracerl.envs.rewards import exact_answer_reward

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "smollm2-135m"
# Answers are at most three digits: 12 tokens leave room for a short sentence around them.
DEFAULT_MAX_NEW_TOKENS = 12
# 200 prompts put one standard error of an accuracy near 10 % at about 2 points.
DEFAULT_HELDOUT = 200


@dataclass(frozen=True)
class LearnTask:
    """Sums `a + b` of two integers drawn uniformly from `low..high`, asked with `template`."""

    name: str
    low: int
    high: int
    template: str
    """A `str.format` pattern with fields `a` and `b`."""

    @property
    def distinct_prompts(self) -> int:
        """How many different prompts the task can produce."""
        return (self.high - self.low + 1) ** 2

    def draw(self, rng: random.Random) -> Task:
        """One task from `rng`."""
        a, b = rng.randint(self.low, self.high), rng.randint(self.low, self.high)
        return {"prompt": self.template.format(a=a, b=b), "answer": a + b}


# Base rates are SmolLM2-135M-Instruct's on the 200 held-out prompts of seed 0, 12 new tokens.
# Both ask for the number only, which the model ignores: it opens with "The sum of a and b is ",
# 12 tokens with two two-digit operands (digits are single tokens), so the answer is cut off
# unless it learns to be brief. Small operands leave room for the answer, hence `medium`.
LEARN_TASKS = {
    # Greedy 0.5 %. "What is {a} + {b}? Answer with a single number." scored 6-11.5 % here.
    "hard": LearnTask("hard", 0, 99, "Compute the sum of {a} and {b}. Reply with the number only."),
    # Greedy 10 %, 6.5 % per sample at temperature 1; only 441 distinct prompts, so 241 train.
    "medium": LearnTask(
        "medium", 0, 20, "Compute the sum of {a} and {b}. Reply with the number only."
    ),
}


def task_rng(name: str, seed: int) -> random.Random:
    """The task stream's generator: a string seed, so it is the same on every machine."""
    return random.Random(f"tracerl.bench.learn:{name}:{seed}")


def split_tasks(
    task: str, n_train: int, n_heldout: int, seed: int
) -> tuple[list[Task], list[Task]]:
    """Train and held-out tasks from one seeded stream: the first `n_heldout` distinct prompts
    are held out, and train takes the following draws whose prompt is not held out (repeats
    within train are allowed, as for any i.i.d. training stream)."""
    spec = LEARN_TASKS[task]
    if n_heldout >= spec.distinct_prompts:
        raise ValueError(
            f"task {task!r} has {spec.distinct_prompts} distinct prompts: "
            f"cannot hold out {n_heldout} and still train"
        )
    rng = task_rng(spec.name, seed)
    heldout: dict[str, Task] = {}
    while len(heldout) < n_heldout:
        drawn = spec.draw(rng)
        heldout.setdefault(drawn["prompt"], drawn)
    train: list[Task] = []
    while len(train) < n_train:
        drawn = spec.draw(rng)
        if drawn["prompt"] not in heldout:
            train.append(drawn)
    return train, list(heldout.values())


def load_policy(name: str = DEFAULT_MODEL) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model in float32 and its tokenizer, from a built-in name or a local HF directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tracerl.models import resolve_model

    path = resolve_model(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(path)


def _replies(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int,
    temperature: float | None,
) -> list[str]:
    """One reply per prompt (greedy when `temperature` is None), each prompt sent as a one-message
    chat, left-padded in batches; only the new tokens are decoded, special tokens dropped."""
    import torch

    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in prompts
    ]
    # Plain sampling at `temperature`: no top-k/top-p truncation, as the trainers sample.
    sampling = (
        {"do_sample": False}
        if temperature is None
        else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    )
    was_training = model.training
    model.eval()
    replies: list[str] = []
    try:
        with torch.no_grad():
            for start in range(0, len(chats), batch_size):
                batch = tokenizer(
                    chats[start : start + batch_size],
                    padding=True,
                    padding_side="left",
                    add_special_tokens=False,
                    return_tensors="pt",
                ).to(model.device)
                # Causal LM classes mix `GenerationMixin` into `PreTrainedModel`.
                out = model.generate(  # type: ignore[operator]
                    **batch,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    **sampling,
                )
                new_tokens = out[:, batch["input_ids"].shape[1] :]  # [B, new]
                replies.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    finally:
        model.train(was_training)
    return replies


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_size: int = 64,
) -> float:
    """The fraction of `tasks` whose greedy reply earns `exact_answer_reward` 1."""
    replies = _replies(
        model, tokenizer, [t["prompt"] for t in tasks], max_new_tokens, batch_size, None
    )
    return sum(exact_answer_reward(t, r) for t, r in zip(tasks, replies, strict=True)) / len(tasks)


def sample_pass_rate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    samples: int,
    temperature: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_size: int = 64,
    seed: int = 0,
) -> float:
    """The fraction of `samples` replies per task, sampled at `temperature`, that earn reward 1.
    Seeds torch's global generator with `seed` first, so a run is repeatable."""
    import torch

    torch.manual_seed(seed)
    repeated = [t for t in tasks for _ in range(samples)]
    replies = _replies(
        model, tokenizer, [t["prompt"] for t in repeated], max_new_tokens, batch_size, temperature
    )
    hits = sum(exact_answer_reward(t, r) for t, r in zip(repeated, replies, strict=True))
    return hits / len(repeated)


def main(argv: list[str] | None = None) -> int:
    """Print the base model's greedy accuracy on the held-out split of `--task` as a JSON line."""
    parser = argparse.ArgumentParser(
        prog="python -m tracerl.bench.learn_tasks", description=__doc__
    )
    parser.add_argument("--task", choices=sorted(LEARN_TASKS), default="hard")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="built-in name or HF directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", type=int, default=DEFAULT_HELDOUT)
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument(
        "--samples", type=int, default=0, help="also the per-sample pass rate at temperature 1"
    )
    args = parser.parse_args(argv)
    _, heldout = split_tasks(args.task, 0, args.heldout, args.seed)
    model, tokenizer = load_policy(args.model)
    result: dict[str, object] = {
        "task": args.task,
        "prompt_example": heldout[0]["prompt"],
        "heldout": len(heldout),
        "greedy_accuracy": greedy_accuracy(model, tokenizer, heldout, args.max_new_tokens),
    }
    if args.samples:
        result["sample_pass_rate"] = sample_pass_rate(
            model, tokenizer, heldout, args.samples, max_new_tokens=args.max_new_tokens
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
