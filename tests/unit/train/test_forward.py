from typing import Any

import pytest
import torch

from tests.conftest import reference_logprobs
from tracerl.train.batch import PackedBatch, TrainSample, micro_batches
from tracerl.train.forward import all_logprobs, all_values
from tracerl.train.models import value_model_from_actor

from .conftest import make_samples


def single_turn(model: Any, temperature: float) -> list[TrainSample]:
    """Prompt + completion samples whose rollout log-probs are the model's own, computed by an
    independent full forward per sample (`tests.conftest.reference_logprobs`)."""
    out = []
    for i, (p, c) in enumerate([(5, 4), (3, 9), (8, 1), (2, 6)]):
        prompt = list(range(10 + i, 10 + i + p))
        completion = list(range(2000 + 7 * i, 2000 + 7 * i + c))
        lp = reference_logprobs(model, prompt, completion, temperature).tolist()
        out.append(TrainSample(prompt + completion, [0] * p + [1] * c, [0.0] * p + lp, 1.0, i))
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("batching", ["pack", "pad"])
def test_logprobs_follow_the_engine_definition(
    tiny: tuple[Any, Any], temperature: float, batching: str
) -> None:
    model, _ = tiny
    samples = single_turn(model, temperature)
    batch = PackedBatch.build(samples, torch.device("cpu"))
    mbs = micro_batches(batch, range(4), token_budget=16, batching=batching)  # type: ignore[arg-type]
    assert len(mbs) > 1
    lp = all_logprobs(model, mbs, batch.token_ids.numel(), temperature, torch.device("cpu"))
    torch.testing.assert_close(lp, batch.rollout_logprobs)


def test_packed_and_padded_values_agree(tiny: tuple[Any, Any]) -> None:
    critic = value_model_from_actor(tiny[0])
    batch = PackedBatch.build(make_samples(2, count=5), torch.device("cpu"))
    n = batch.token_ids.numel()
    cpu = torch.device("cpu")
    packed = all_values(critic, micro_batches(batch, range(5), 24, "pack"), n, cpu)
    padded = all_values(critic, micro_batches(batch, range(5), 24, "pad"), n, cpu)
    alone = all_values(critic, micro_batches(batch, range(5), 1, "pack"), n, cpu)  # one each
    torch.testing.assert_close(packed, padded)
    torch.testing.assert_close(packed, alone)
    assert bool((packed[batch.loss_mask == 0] == 0).all())
    assert bool((packed[batch.loss_mask == 1] != 0).all())
