from typing import Any

import pytest
import torch
import transformers.modeling_utils

from tests.conftest import reference_logprobs
from tracerl.algo.losses import entropy_from_logits
from tracerl.train import forward
from tracerl.train.batch import PackedBatch, TrainSample, micro_batches
from tracerl.train.forward import action_logprobs, all_logprobs, all_values
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
@pytest.mark.parametrize("batching", ["pack", "bucket", "pad"])
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
    # entropies of the same distributions, against the textbook formula on a full forward
    entropy = torch.zeros_like(lp)
    with torch.no_grad():
        for mb in mbs:
            entropy[mb.actions] = action_logprobs(model, mb, temperature, with_entropy=True)[1]
        expected = torch.zeros_like(lp)
        for i, s in enumerate(samples):
            logits = model(torch.tensor([s.token_ids])).logits[0, :-1].float()  # predicts 1..n
            scaled = logits / (temperature if temperature > 0 else 1.0)
            start = int(batch.cu_seqlens[i])
            mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
            positions = torch.arange(start + 1, start + len(s.token_ids))[mask]
            expected[positions] = entropy_from_logits(scaled[mask])
    torch.testing.assert_close(entropy, expected)


@pytest.mark.parametrize("batching", ["pack", "bucket", "pad"])
def test_models_that_cannot_keep_logits_by_mask_get_the_same_logprobs(
    tiny: tuple[Any, Any], batching: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers before 5.21 reads a boolean `logits_to_keep` as positions: such a model's
    logits are computed everywhere and masked afterwards, with the same result."""
    model, _ = tiny
    assert forward.keeps_logits_by_mask(type(model)) == hasattr(
        transformers.modeling_utils, "slice_logits_to_keep"
    )
    assert not forward.keeps_logits_by_mask(type("Old", (torch.nn.Module,), {}))
    seen: list[Any] = []
    original = model.forward

    def old_forward(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["logits_to_keep"])
        return original(*args, **kwargs)

    samples = single_turn(model, 1.0)
    monkeypatch.setattr(forward, "keeps_logits_by_mask", lambda cls: False)
    monkeypatch.setattr(model, "forward", old_forward)
    batch = PackedBatch.build(samples, torch.device("cpu"))
    mbs = micro_batches(batch, range(4), token_budget=16, batching=batching)  # type: ignore[arg-type]
    lp = all_logprobs(model, mbs, batch.token_ids.numel(), 1.0, torch.device("cpu"))
    torch.testing.assert_close(lp, batch.rollout_logprobs)
    assert seen and all(keep == 0 for keep in seen)


def test_packed_and_padded_values_agree(tiny: tuple[Any, Any]) -> None:
    critic = value_model_from_actor(tiny[0])
    batch = PackedBatch.build(make_samples(2, count=5), torch.device("cpu"))
    n = batch.token_ids.numel()
    cpu = torch.device("cpu")
    packed = all_values(critic, micro_batches(batch, range(5), 24, "pack"), n, cpu)
    padded = all_values(critic, micro_batches(batch, range(5), 24, "pad"), n, cpu)
    grouped = all_values(critic, micro_batches(batch, range(5), 24, "bucket"), n, cpu)
    alone = all_values(critic, micro_batches(batch, range(5), 1, "pack"), n, cpu)  # one each
    torch.testing.assert_close(packed, padded)
    torch.testing.assert_close(packed, grouped)
    torch.testing.assert_close(packed, alone)
    assert bool((packed[batch.loss_mask == 0] == 0).all())
    assert bool((packed[batch.loss_mask == 1] != 0).all())
