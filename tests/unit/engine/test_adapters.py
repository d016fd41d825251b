"""Several LoRA adapters in one embedded engine (`tracerl.engine.adapters`): each request is
sampled by the adapter it names (`lora_path`), or by the base, even when they share a forward
step; the adapter pushed last is merged into float32 base weights (its steps run no adapter
layer) and pushes never drift the base; the prefix cache never hands one adapter's K/V to
another; an unknown name is refused."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import torch

from tests.conftest import reference_logprobs
from tracerl.config.train import LoraConfig
from tracerl.engine import forward as forward_module
from tracerl.engine.adapters import AdapterWeights, merged_adapter, tuner_layers
from tracerl.engine.types import GenerateRequest, RequestError
from tracerl.train import lora


def adapted(base: Any, seed: int) -> Any:
    """`base` with a rank-4 adapter whose B is far from zero (it changes every output)."""
    model = copy.deepcopy(base)
    torch.manual_seed(seed)
    lora.add_adapters(model, LoraConfig(rank=4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.5)
    return model.eval()


def push(model: Any, name: str) -> AdapterWeights:
    weights = lora.adapter_weights(model)
    return AdapterWeights(name, weights.config, weights.tensors)


def req(ids: list[int], adapter: str | None, seed: int = 0, new: int = 8) -> GenerateRequest:
    return GenerateRequest(
        input_ids=ids,
        lora_path=adapter,
        sampling_params={"max_new_tokens": new, "temperature": 1.0, "seed": seed},
    )


@pytest.fixture
def references(tiny: tuple[Any, Any]) -> dict[str | None, Any]:
    base = copy.deepcopy(tiny[0]).eval()
    return {None: base, "a": adapted(base, 1), "b": adapted(base, 2)}


def assert_sampled_by(model: Any, request: GenerateRequest, out: Any) -> None:
    expected = reference_logprobs(model, request.input_ids, out.output_ids, 1.0)
    got = torch.tensor(out.output_logprobs)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("forward", ["slots", "generic"])
async def test_requests_of_different_adapters_in_one_step_each_get_their_own(
    make_engine: Any,
    references: dict[str | None, Any],
    forward: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mixed_steps = []
    original = forward_module.adapters_for

    def spy(model: Any, names: list[str | None]) -> Any:
        mixed_steps.append(len(set(names)) > 1)
        return original(model, names)

    monkeypatch.setattr(forward_module, "adapters_for", spy)
    engine = make_engine(forward=forward)
    await engine.update_adapter(push(references["a"], "a"), 1)
    await engine.update_adapter(push(references["b"], "b"), 2)
    assert engine.adapter_names() == {"a", "b"}
    requests = [
        req(list(range(100, 130)), "a"),
        req(list(range(200, 225)), "b", seed=1),
        req(list(range(300, 320)), None, seed=2),
        req(list(range(400, 440)), "a", seed=3),
    ]
    outs = await asyncio.gather(*(engine.generate(r) for r in requests))
    for request, out in zip(requests, outs, strict=True):
        assert len(out.output_ids) == 8
        assert_sampled_by(references[request.lora_path], request, out)
    if forward == "slots":
        assert any(mixed_steps)  # some step ran several adapters at once


async def test_the_prefix_cache_keeps_each_adapters_kv_apart(
    make_engine: Any, references: dict[str | None, Any]
) -> None:
    engine = make_engine(forward="slots")
    await engine.update_adapter(push(references["a"], "a"), 1)
    await engine.update_adapter(push(references["b"], "b"), 2)
    prompt = list(range(100, 140))
    first = await engine.generate(req(prompt, "a"))
    hits = engine.stats().prefix_cache_hits_total
    # the same tokens under another adapter: nothing of "a"'s K/V may serve it
    other = req(prompt + first.output_ids + [7, 8, 9], "b", seed=1)
    assert_sampled_by(references["b"], other, await engine.generate(other))
    assert engine.stats().prefix_cache_hits_total == hits
    # the next turn under "a" reuses "a"'s own
    again = req(prompt + first.output_ids + [7, 8, 9], "a", seed=2)
    assert_sampled_by(references["a"], again, await engine.generate(again))
    assert engine.stats().prefix_cache_hits_total > hits


async def test_a_request_for_an_adapter_not_loaded_is_refused_by_field(
    make_engine: Any, references: dict[str | None, Any]
) -> None:
    engine = make_engine()
    with pytest.raises(RequestError) as refused:
        await engine.generate(req([1, 2, 3], "a"))
    assert refused.value.field == "lora_path" and "loaded: none" in str(refused.value)
    await engine.update_adapter(push(references["a"], "a"), 1)
    with pytest.raises(RequestError, match=r"no adapter 'c' is loaded \(loaded: a\)"):
        await engine.generate(req([1, 2, 3], "c"))
    out = await engine.generate(req(list(range(50, 60)), None))  # the base still serves
    assert_sampled_by(references[None], req(list(range(50, 60)), None), out)


def base_weights(model: Any) -> dict[str, torch.Tensor]:
    """The adapted layers' base weights, by the layer's name in an unadapted model."""
    return {
        f"{name}.weight": layer.get_base_layer().weight.detach().clone()
        for name, layer in tuner_layers(model).items()
    }


async def test_the_adapter_pushed_last_is_merged_and_its_steps_add_no_adapter_term(
    make_engine: Any, references: dict[str | None, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(forward="slots")
    original = dict(references[None].named_parameters())
    await engine.update_adapter(push(references["a"], "a"), 1)
    await engine.update_adapter(push(references["b"], "b"), 2)
    assert merged_adapter(engine.model) == "b"
    b_layers = tuner_layers(references["b"])
    for key, weight in base_weights(engine.model).items():  # W + (alpha / r) B A of "b"
        layer = b_layers[key.removesuffix(".weight")]
        expected = original[key] + layer.get_delta_weight(next(iter(layer.lora_A)))
        torch.testing.assert_close(weight, expected, atol=1e-6, rtol=0)
    hooked = []
    monkeypatch.setattr(
        torch.nn.Module, "register_forward_hook", lambda *a, **k: hooked.append(a) or 1 / 0
    )
    request = req(list(range(100, 130)), "b")
    assert_sampled_by(references["b"], request, await engine.generate(request))
    assert hooked == []  # the plain forward: no delta added anywhere


async def test_many_pushes_leave_the_base_and_every_adapter_exact(
    make_engine: Any, references: dict[str | None, Any]
) -> None:
    engine = make_engine(forward="slots")
    original = base_weights(copy.deepcopy(references["a"]))  # the base, under adapted names
    for round_index in range(12):  # each push a new adapter value, merged in turn
        name = "ab"[round_index % 2]
        with torch.no_grad():
            for key, p in references[name].named_parameters():
                if ".lora_B." in key:
                    p.normal_(0, 0.5)
        await engine.update_adapter(push(references[name], name), round_index + 1)
    assert merged_adapter(engine.model) == "b"
    merged_layers = tuner_layers(engine.model)
    for key, weight in base_weights(engine.model).items():
        delta = merged_layers[key.removesuffix(".weight")].get_delta_weight("b")
        torch.testing.assert_close(weight - delta, original[key], atol=1e-6, rtol=0)
    requests = [req(list(range(60, 90)), n, seed=i) for i, n in enumerate(["a", None, "b"])]
    outs = await asyncio.gather(*(engine.generate(r) for r in requests))
    for request, out in zip(requests, outs, strict=True):
        assert_sampled_by(references[request.lora_path], request, out)


async def test_half_precision_weights_keep_the_adapter_in_the_forward(
    make_engine: Any, references: dict[str | None, Any]
) -> None:
    engine = make_engine(forward="slots")
    engine.model.to(torch.bfloat16)
    before = base_weights(copy.deepcopy(references["a"]).to(torch.bfloat16))
    await engine.update_adapter(push(references["a"], "a"), 1)
    assert merged_adapter(engine.model) is None  # bfloat16 would round the delta away
    for key, weight in base_weights(engine.model).items():
        assert torch.equal(weight, before[key])
