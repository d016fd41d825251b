"""`tracerl bench moe`: routing replay on a random Qwen3-MoE, and what recording it costs.

A random Qwen3-MoE (the SmolLM2 tokenizer; 4 layers of 32 experts, top-4, hidden 128: enough
experts and layers that near-tied router scores flip between dtypes) is saved once; then, for
the embedded engine in bfloat16 (as on GPUs) and in float32, against a float32 trainer:

1. the engine samples 16 sequences (prompts of 32-64 random tokens, 64 new tokens each,
   temperature 1) with `return_routed_experts`;
2. the trainer scores the same tokens twice (`tracerl.train.forward.all_logprobs` over its own
   micro-batches): with the recorded routing replayed, and routing by itself;
3. figures: the train-inference log-prob mismatch |trainer - engine| over the sampled tokens
   (mean and max), with replay and without, and the share of (token, layer) pairs, and of
   tokens in any layer, whose top-k set the trainer's own routers choose differently from the
   engine's (one independent forward per sequence).

The capture's cost: the bfloat16 engine generating the same requests with recording on and
off, alternating, two rounds each (tokens per second); and bytes per token: the raw record
(layers x top-k x 1 byte) and the growth of the trace store's row (the turn's JSON, routing in
base64, against the same turn without it).

Target: where top-k flips occur, replay cuts the mean mismatch at least 10x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

LAYERS, EXPERTS, TOP_K, HIDDEN = 4, 32, 4, 128
REQUESTS, NEW_TOKENS = 16, 64
TARGET_RATIO = 10.0


def build_model(out: Path) -> Path:
    from tracerl.models import build_random_model

    return build_random_model(
        out,
        "qwen3_moe",
        hidden_size=HIDDEN,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=0.1,  # as the families of the tests: experts that matter
    )


def prompts(requests: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(32, 65, (requests,), generator=g)
    return [torch.randint(100, 40000, (int(n),), generator=g).tolist() for n in lengths]


async def sample(model_dir: Path, dtype: str, record: bool, batch: list[list[int]]) -> Any:
    """The engine's outputs for `batch` and its generation time in seconds."""
    from tracerl.config import EngineConfig
    from tracerl.engine.local import LocalEngine
    from tracerl.engine.types import GenerateRequest, SamplingParams

    engine = LocalEngine(
        EngineConfig.model_validate(
            {
                "model": str(model_dir), "device": "cpu", "dtype": dtype, "max_model_len": 512,
                "record_routed_experts": record, "prefix_cache": False,
            }
        )
    )  # fmt: skip
    async with engine:
        requests = [
            GenerateRequest(
                rid=f"r{i}",
                input_ids=p,
                return_routed_experts=True,
                sampling_params=SamplingParams(
                    max_new_tokens=NEW_TOKENS, temperature=1.0, seed=i, ignore_eos=True
                ),
            )
            for i, p in enumerate(batch)
        ]
        start = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(r) for r in requests))
        seconds = time.perf_counter() - start
    return outs, seconds


def own_routing(model: Any, ids: list[int]) -> np.ndarray:
    """The model's own routing of `ids` in one forward `[len(ids), L, k]`."""
    from tracerl.routing import RoutingCapture

    capture = RoutingCapture(model)
    with torch.no_grad(), capture.capture():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    return capture.take()


def mismatch(trainer: Any, outs: list[Any], batch: list[list[int]], replay: bool) -> np.ndarray:
    """|trainer - engine| log-prob over every sampled token, replaying the engine's routing or
    routing by itself."""
    from tracerl.train import TrainSample
    from tracerl.train.batch import PackedBatch
    from tracerl.train.forward import all_logprobs

    samples = []
    for prompt, out in zip(batch, outs, strict=True):
        ids = prompt + out.output_ids
        samples.append(
            TrainSample(
                ids,
                [0] * len(prompt) + [1] * len(out.output_ids),
                [0.0] * len(prompt) + out.output_logprobs,
                0.0,
                routed_experts=out.routed_experts if replay else None,
            )
        )
    packed = PackedBatch.build(samples, trainer.device)
    mbs = trainer.micro_batches(packed, list(range(len(samples))))
    scored = all_logprobs(trainer.actor, mbs, packed.token_ids.numel(), 1.0, trainer.device)
    actions = packed.loss_mask.bool()
    return (scored[actions] - packed.rollout_logprobs[actions]).abs().numpy()


def flips(model: Any, outs: list[Any], batch: list[list[int]]) -> tuple[float, float, np.ndarray]:
    """Shares of (token, layer) pairs and of tokens (any layer) whose top-k set the trainer's
    routers choose differently from the engine's, over every fed position; and, per sampled
    token (in `mismatch`'s order), whether the position predicting it flipped in any layer."""
    pairs, tokens, total = 0, 0, 0
    flipped: list[np.ndarray] = []
    for prompt, out in zip(batch, outs, strict=True):
        ids = prompt + out.output_ids
        fed = len(ids) - 1  # the last token is never fed
        own = np.sort(own_routing(model, ids[:fed]).astype(np.int64), axis=-1)
        recorded = np.sort(out.routed_experts[:fed].astype(np.int64), axis=-1)
        differs = (own != recorded).any(-1)  # [fed, L]
        pairs += int(differs.sum())
        tokens += int(differs.any(-1).sum())
        total += fed
        flipped.append(differs.any(-1)[len(prompt) - 1 :])
    return pairs / (total * LAYERS), tokens / total, np.concatenate(flipped)


def store_bytes_per_token(outs: list[Any], batch: list[list[int]]) -> float:
    """Growth of the trace store's turn row per token when it holds the routing."""
    from tracerl.gateway.store import turn_json
    from tracerl.routing import RoutedExperts
    from tracerl.trace.schema import Turn

    grown, tokens = 0, 0
    for prompt, out in zip(batch, outs, strict=True):
        turn = Turn.model_construct(
            index=0, endpoint="chat.completions", prompt_ids=prompt,
            completion_ids=out.output_ids, completion_logprobs=out.output_logprobs,
            finish_reason="length", weight_version=0, request={}, response={},
        )  # fmt: skip
        with_routing = turn.model_copy(
            update={"routed_experts": RoutedExperts.of(out.routed_experts)}
        )
        grown += len(turn_json(with_routing)) - len(turn_json(turn))
        tokens += len(prompt) + len(out.output_ids)
    return grown / tokens


def main(args: argparse.Namespace) -> int:
    from tracerl.config.train import MoeConfig, TrainerConfig
    from tracerl.train import Trainer

    requests = 4 if args.quick else REQUESTS
    batch = prompts(requests)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "qwen3-moe")
        trainer = Trainer(
            TrainerConfig(
                model=str(model_dir), algorithm="grpo", token_budget=8192,
                moe=MoeConfig(routing="replay"),
            ),
            device="cpu",
        )  # fmt: skip
        result: dict[str, Any] = {"bench": "moe", "layers": LAYERS, "experts": EXPERTS}
        result["top_k"] = TOP_K
        outs_bf16: list[Any] = []
        for dtype in ("bfloat16", "float32"):
            outs, _ = asyncio.run(sample(model_dir, dtype, True, batch))
            if dtype == "bfloat16":
                outs_bf16 = outs
            replay = mismatch(trainer, outs, batch, replay=True)
            recompute = mismatch(trainer, outs, batch, replay=False)
            pair_flips, token_flips, at_flip = flips(trainer.actor, outs, batch)
            ratio = float(recompute.mean() / max(replay.mean(), 1e-12))
            result[f"engine_{dtype}"] = {
                "replay_mean": float(replay.mean()),
                "replay_max": float(replay.max()),
                "recompute_mean": float(recompute.mean()),
                "recompute_max": float(recompute.max()),
                "mean_ratio": ratio,
                "topk_flip_pairs": pair_flips,
                "topk_flip_tokens": token_flips,
                # the sampled tokens predicted from a position whose top-k flipped
                "flipped_tokens": int(at_flip.sum()),
                "flipped_replay_mean": float(replay[at_flip].mean()) if at_flip.any() else 0.0,
                "flipped_recompute_mean": float(recompute[at_flip].mean())
                if at_flip.any()
                else 0.0,
            }
        rates: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(1 if args.quick else 2):
            for record in (False, True) if round_ % 2 == 0 else (True, False):
                _, seconds = asyncio.run(sample(model_dir, "bfloat16", record, batch))
                rates[record].append(requests * NEW_TOKENS / seconds)
    on, off = max(rates[True]), max(rates[False])
    result["tokens_per_s_recording"] = on
    result["tokens_per_s_not_recording"] = off
    result["recording_throughput_ratio"] = on / off
    result["record_bytes_per_token"] = LAYERS * TOP_K * 1
    result["store_bytes_per_token"] = store_bytes_per_token(outs_bf16, batch)
    flipped = [d for d in ("bfloat16", "float32") if result[f"engine_{d}"]["topk_flip_pairs"] > 0]
    result["targets"] = {
        f"engine_{d}_mean_ratio_ge_{TARGET_RATIO:g}x": result[f"engine_{d}"]["mean_ratio"]
        >= TARGET_RATIO
        for d in flipped
    }
    result["target_met"] = bool(flipped) and all(result["targets"].values())
    print(json.dumps(result))
    return 0
