"""On the real model (SmolLM2-135M-Instruct): after every weight push, the engine's log-probs
of what it samples equal the trainer's log-probs of the same tokens. If they drifted, every
importance ratio the trainer computes would be off (the rollout policy would not be the one the
engine ran), whatever the losses' tests say."""

from __future__ import annotations

import pytest
import torch

from tracerl.config import EngineConfig
from tracerl.config.train import TrainerConfig
from tracerl.engine.local import LocalEngine
from tracerl.engine.types import GenerateRequest, SamplingParams
from tracerl.train import Trainer, TrainSample
from tracerl.train.batch import PackedBatch
from tracerl.train.forward import all_logprobs

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m"
TEMPERATURE = 1.0


def trainer_logprobs(trainer: Trainer, prompt: list[int], output: list[int]) -> torch.Tensor:
    """The trainer's log-probs of `output` after `prompt`, through its own forward path."""
    sample = TrainSample(
        prompt + output, [0] * len(prompt) + [1] * len(output), [0.0] * (len(prompt) + len(output)),
        0.0,
    )  # fmt: skip
    batch = PackedBatch.build([sample], trainer.device)
    mbs = trainer.micro_batches(batch, [0])
    out = all_logprobs(trainer.actor, mbs, batch.token_ids.numel(), TEMPERATURE, trainer.device)
    return out[len(prompt) :]


async def test_engine_and_trainer_log_probs_agree_after_each_push() -> None:
    trainer = Trainer(
        TrainerConfig(model=MODEL, algorithm="grpo", temperature=TEMPERATURE, actor={"lr": 1e-4}),
        device="cpu",
    )
    engine = LocalEngine(
        EngineConfig(model=MODEL, device="cpu", kv_cache_tokens=2048, max_model_len=512)
    )
    await engine.start()
    try:
        tokenizer = trainer.tokenizer
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Compute the sum of 12 and 30."}],
            add_generation_prompt=True,
            tokenize=False,
        )
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        outputs: list[list[int]] = []
        for version in range(3):  # the base weights, then after two trained pushes
            request = GenerateRequest(
                rid=f"v{version}",
                input_ids=ids,
                sampling_params=SamplingParams(
                    max_new_tokens=16, temperature=TEMPERATURE, seed=7, ignore_eos=True
                ),
            )
            out = await engine.generate(request)
            assert out.weight_version == version
            outputs.append(list(out.output_ids))
            expected = trainer_logprobs(trainer, ids, list(out.output_ids))
            # float32 on both sides, but the engine decodes token by token from its KV cache
            # while the trainer runs one forward: the kernels sum in other orders, which moved
            # a log-prob by 0.9-2.2e-5 here; a stale engine would be off by more than 1e-3
            # (asserted at the end: what the pushes changed).
            torch.testing.assert_close(
                torch.tensor(out.output_logprobs), expected, atol=1e-4, rtol=1e-4
            )
            if version == 2:
                break
            rewards = [1.0, 0.0, 1.0, 0.0]
            samples = [
                TrainSample(
                    ids + outputs[-1][: 8 + k], [0] * len(ids) + [1] * (8 + k),
                    [0.0] * len(ids) + list(out.output_logprobs[: 8 + k]), r, 0,
                )
                for k, r in enumerate(rewards)
            ]  # fmt: skip
            trainer.step(samples)
            await engine.update_weights(trainer.actor_named_tensors(), version + 1)
        # the pushes changed the policy the engine samples from
        moved = trainer_logprobs(trainer, ids, outputs[0])
        base = Trainer(TrainerConfig(model=MODEL, algorithm="grpo"), device="cpu")
        assert (moved - trainer_logprobs(base, ids, outputs[0])).abs().max() > 1e-3
    finally:
        await engine.close()
