"""`tracerl bench step`: the trainer's GRPO step against a plain Hugging Face step (one padded
forward, the policy-gradient loss on the completion tokens, backward, grad clipping, AdamW) on
the same batch, side by side in one run.

The batch is the learning benchmark's (`tracerl bench learn`): 4 prompts of its `hard` task
rendered with the chat template, 8 completions of 12 tokens each, rewards alternating within a
group so that every sample has a non-zero advantage (the trainer's skip of zero-advantage
samples would otherwise flatter it). Both start from the same weights, with the same lr,
clipping and fused AdamW; the plain step is what a 50-line script writes: left-padded prompts,
`logits_to_keep` over the completion, `log_softmax` at the sampled tokens, `-(A * logp)` over
completion tokens. The rollout log-probs given to the trainer are the model's own, so its
importance weights are 1 and both steps compute the same gradient: after the first step their
parameter updates are compared (`update_rel_diff`).

Steps alternate between the two and the fastest of each is reported: on a shared machine other
processes only ever add time. The first step of each is the warm-up and is not timed.
`--autocast` times a third trainer, `trainer.autocast = "bfloat16"`, in the same rounds
(`float32_vs_autocast`), and compares its first update with the float32 trainer's
(`autocast_update_rel_diff`).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import torch

from tracerl.algo.advantages import group_advantages
from tracerl.bench.learn_tasks import LEARN_TASKS
from tracerl.config.train import OptimizerConfig, TrainerConfig
from tracerl.train.batch import TrainSample
from tracerl.train.trainer import Trainer

TARGET_RATIO = 1.0  # the trainer's step at least as fast as the plain one
PROMPTS, GROUP, COMPLETION = 4, 8, 12
LR = 5e-6


class PlainBatch:
    """The batch as a plain script holds it: left-padded `[B, P + C]` ids and mask."""

    def __init__(self, prompts: list[list[int]], completions: list[list[int]], pad: int):
        width = max(len(p) for p in prompts)
        rows, masks = [], []
        for p, c in zip(prompts, completions, strict=True):
            fill = width - len(p)
            rows.append([pad] * fill + p + c)
            masks.append([0] * fill + [1] * (len(p) + len(c)))
        self.input_ids = torch.tensor(rows)
        self.attention_mask = torch.tensor(masks)
        self.position_ids = (self.attention_mask.cumsum(-1) - 1).clamp_min(0)
        self.completion = torch.tensor(completions)  # [B, C]

    def logprobs(self, model: Any) -> torch.Tensor:
        """Log-probs of the completion tokens `[B, C]`."""
        c = self.completion.shape[1]
        logits = (
            model(
                input_ids=self.input_ids,
                attention_mask=self.attention_mask,
                position_ids=self.position_ids,
                logits_to_keep=c + 1,
                use_cache=False,
            )
            .logits[:, :-1]
            .float()
        )
        chosen = logits.gather(-1, self.completion[..., None])[..., 0]
        return chosen - logits.logsumexp(-1)


def plain_step(
    model: Any, optimizer: torch.optim.Optimizer, batch: PlainBatch, advantages: torch.Tensor
) -> float:
    logp = batch.logprobs(model)
    loss = -(advantages[:, None] * logp).sum() / logp.numel()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def make_batch(tokenizer: Any, seed: int) -> tuple[list[list[int]], list[list[int]], list[float]]:
    """Prompts (each repeated for its group), random completions, alternating rewards."""
    rng = random.Random(seed)
    task = LEARN_TASKS["hard"]
    prompts, completions, rewards = [], [], []
    for _ in range(PROMPTS):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": task.draw(rng)["prompt"]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for j in range(GROUP):
            prompts.append(list(ids))
            completions.append([rng.randrange(3, len(tokenizer)) for _ in range(COMPLETION)])
            rewards.append(float(j % 2))
    return prompts, completions, rewards


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tracerl bench step", description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=3, help="timed steps of each")
    parser.add_argument("--quick", action="store_true", help="1 timed round")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--autocast",
        action="store_true",
        help="also time the trainer with trainer.autocast = bfloat16 in the same rounds",
    )
    return parser.parse_args(argv)


def _params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    rounds = 1 if args.quick else args.rounds
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = TrainerConfig(
        model=args.model,
        algorithm="grpo",
        temperature=1.0,
        token_budget=4096,
        actor=OptimizerConfig(lr=LR, schedule="constant"),
    )
    trainer = Trainer(config, device="cpu")
    plain = Trainer(config, device="cpu")  # the same weights: both seeded by config.seed
    mixed = (
        Trainer(config.model_copy(update={"autocast": "bfloat16"}), device="cpu")
        if args.autocast
        else None
    )
    model, tokenizer = plain.actor, trainer.tokenizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)
    prompts, completions, rewards = make_batch(tokenizer, seed=0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batch = PlainBatch(prompts, completions, pad)
    groups = torch.arange(len(rewards)) // GROUP
    advantages = group_advantages(torch.tensor(rewards), groups)  # GRPO, as the trainer's
    with torch.no_grad():
        rollout = batch.logprobs(model)  # [B, C]: the policy's own, so TIS weights are 1
    samples = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        logprobs = [0.0] * len(p) + rollout[i].tolist()
        mask = [0] * len(p) + [1] * len(c)
        samples.append(TrainSample(p + c, mask, logprobs, rewards[i], group_id=i // GROUP))
    before = _params(model)
    trainer.step(samples)  # warm-up, and the update compared
    plain_step(model, optimizer, batch, advantages)
    delta_trainer = _params(trainer.actor) - before
    delta_plain = _params(model) - before
    rel_diff = float((delta_trainer - delta_plain).norm() / delta_plain.norm())
    times: dict[str, list[float]] = {"trainer": [], "plain": []}
    autocast: dict[str, Any] = {}
    if mixed is not None:  # its first update against the float32 trainer's
        mixed.step(samples)
        delta_mixed = _params(mixed.actor) - before
        diff = (delta_mixed - delta_trainer).norm() / delta_trainer.norm()
        autocast["autocast_update_rel_diff"] = round(float(diff), 5)
        times["trainer_autocast"] = []
    for _ in range(rounds):
        started = time.perf_counter()
        trainer.step(samples)
        times["trainer"].append(time.perf_counter() - started)
        started = time.perf_counter()
        plain_step(model, optimizer, batch, advantages)
        times["plain"].append(time.perf_counter() - started)
        if mixed is not None:
            started = time.perf_counter()
            mixed.step(samples)
            times["trainer_autocast"].append(time.perf_counter() - started)
    best = {name: min(t) for name, t in times.items()}
    ratio = best["plain"] / best["trainer"]
    if mixed is not None:
        autocast["trainer_autocast_step_s"] = [round(t, 3) for t in times["trainer_autocast"]]
        autocast["float32_vs_autocast"] = round(best["trainer"] / best["trainer_autocast"], 3)
    result = {
        "benchmark": "step",
        "model": args.model,
        "threads": torch.get_num_threads(),
        "samples": len(samples),
        "tokens": sum(len(s.token_ids) for s in samples),
        "padded_tokens": int(batch.input_ids.numel()),
        "trainer_step_s": [round(t, 3) for t in times["trainer"]],
        "plain_step_s": [round(t, 3) for t in times["plain"]],
        "plain_vs_trainer": round(ratio, 3),
        "update_rel_diff": round(rel_diff, 5),
        **autocast,
        "targets": {"plain_vs_trainer_min": TARGET_RATIO, "update_rel_diff_max": 0.01},
        "target_met": ratio >= TARGET_RATIO and rel_diff <= 0.01,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
