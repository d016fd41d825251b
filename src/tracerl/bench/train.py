"""`tracerl bench train`: training tokens/s of one PPO step (critic forward and update, actor
update) with the trainer's token-budget batching (`batching = "auto"`: packed rows under
flash-attention, else grouped by length) against naive padding to the longest trajectory, side
by side on the same batch of trajectories whose lengths vary 10x.

Both trainers start from the same weights and config except `batching`; their first steps'
losses are compared (the two layouts must compute the same thing), then steps alternate between
them and the fastest step of each gives its tokens/s (real tokens, padding excluded): on a
shared machine other processes only ever add time. The first step of each is the warm-up and
is not timed.

The model matters: `tiny` spends nearly all its time in its 49k-row vocabulary head, which both
layouts evaluate only at action tokens, so padding costs it little; a real model's backbone
(smollm2-135m: ~80 % of the flops) runs on every padded position.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from tracerl.config.train import CriticOptimizerConfig, OptimizerConfig, TrainerConfig
from tracerl.train.batch import TrainSample
from tracerl.train.trainer import Trainer

TARGET_SPEEDUP = 1.5
TARGET_LENGTH_RATIO = 10.0
# Roughly what the near-uniform `tiny` model assigns a token (log 1/49280), so TIS weights ~ 1.
ROLLOUT_LOGPROB = -10.8
COMPARED = ("actor/policy_loss", "critic/value_loss")


def make_batch(count: int, shortest: int, seed: int, vocab: int) -> list[TrainSample]:
    """`count` trajectories from `shortest` to 10x `shortest` tokens (evenly spread, shuffled),
    a quarter prompt and the rest sampled; groups of four with rewards 0 and 1."""
    g = torch.Generator().manual_seed(seed)
    longest = int(shortest * TARGET_LENGTH_RATIO)
    spread = torch.linspace(shortest, longest, count).round().long()
    lengths = spread[torch.randperm(count, generator=g)].tolist()
    out = []
    for i, n in enumerate(lengths):
        prompt = max(1, n // 4)
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        mask = [0] * prompt + [1] * (n - prompt)
        logprobs = [ROLLOUT_LOGPROB * m for m in mask]
        out.append(TrainSample(ids, mask, logprobs, float(i % 2), group_id=i // 4))
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tracerl bench train", description=__doc__)
    parser.add_argument(
        "--model", default="smollm2-135m", help="actor (built-in name or HF directory)"
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--trajectories", type=int, default=24)
    parser.add_argument("--shortest", type=int, default=16, help="tokens of the shortest one")
    parser.add_argument("--token-budget", type=int, default=1280)
    parser.add_argument("--rounds", type=int, default=3, help="timed steps per layout")
    parser.add_argument("--quick", action="store_true", help="16 trajectories, 1 round")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.quick:
        args.trajectories, args.rounds = 16, 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    trainers: dict[str, Trainer] = {}
    for batching in ("auto", "pad"):
        config = TrainerConfig(
            model=args.model,
            algorithm="ppo",
            token_budget=args.token_budget,
            batching=batching,
            actor=OptimizerConfig(lr=1e-6),
            critic=CriticOptimizerConfig(lr=1e-5),
        )
        trainers[batching] = Trainer(config, device=args.device)
    vocab = len(trainers["auto"].tokenizer)
    samples = make_batch(args.trajectories, args.shortest, seed=0, vocab=vocab)
    lengths = [len(s.token_ids) for s in samples]
    first = {name: trainer.step(samples) for name, trainer in trainers.items()}  # also warm-up
    same = {k: [first["auto"][k], first["pad"][k]] for k in COMPARED}
    times: dict[str, list[float]] = {"auto": [], "pad": []}
    for _ in range(args.rounds):
        for name, trainer in trainers.items():
            started = time.perf_counter()
            trainer.step(samples)
            times[name].append(time.perf_counter() - started)
    tokens = sum(lengths)
    step_s = {name: min(t) for name, t in times.items()}
    rate = {name: tokens / s for name, s in step_s.items()}
    speedup = rate["auto"] / rate["pad"]
    length_ratio = max(lengths) / min(lengths)
    result: dict[str, Any] = {
        "benchmark": "train",
        "model": args.model,
        "device": str(trainers["auto"].device),
        "threads": torch.get_num_threads(),
        "algorithm": "ppo",
        "trajectories": len(samples),
        "length_min": min(lengths),
        "length_max": max(lengths),
        "tokens": tokens,
        "padded_tokens": len(lengths) * max(lengths),
        "token_budget": args.token_budget,
        "batching": trainers["auto"].batching,
        "batched_step_s": [round(t, 2) for t in times["auto"]],
        "padded_step_s": [round(t, 2) for t in times["pad"]],
        "batched_tokens_per_s": round(rate["auto"], 1),
        "padded_tokens_per_s": round(rate["pad"], 1),
        "speedup": round(speedup, 2),
        "first_step_losses_batched_padded": same,
        "targets": {"speedup_min": TARGET_SPEEDUP, "length_ratio_min": TARGET_LENGTH_RATIO},
        "target_met": speedup >= TARGET_SPEEDUP and length_ratio >= TARGET_LENGTH_RATIO,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
