"""The embedded engine's prefix cache: a turn that extends a finished one prefills only its new
tokens, with the log-probs of an independent full forward; a weight update, KV pressure, the
generic path and `engine.prefix_cache = false` all mean a full prefill."""

from __future__ import annotations

import asyncio

import torch

from tests.conftest import reference_logprobs
from tests.waiting import wait_until
from tracerl.engine.types import GenerateOutput, GenerateRequest


def req(ids: list[int], seed: int = 0, new: int = 12) -> GenerateRequest:
    return GenerateRequest(
        input_ids=ids,
        sampling_params={
            "max_new_tokens": new,
            "temperature": 1.0,
            "seed": seed,
            "ignore_eos": True,
        },
    )


def prompt(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


async def two_turns(engine, between=None) -> tuple[list[int], GenerateOutput]:
    """A 40-token prompt, 12 sampled tokens, then a turn that adds 10 tokens after them."""
    first = prompt(40, 100)
    out = await engine.generate(req(first))
    if between is not None:
        await between(engine)
    turn = first + out.output_ids + prompt(10, 900)
    return turn, await engine.generate(req(turn, seed=1))


def hits(engine) -> int:
    return engine.stats().prefix_cache_hits_total


async def test_a_next_turn_prefills_only_its_new_tokens_with_exact_logprobs(make_engine) -> None:
    engine = make_engine()
    turn, out = await two_turns(engine)
    # everything of the first turn that has K/V: its prompt and all but its last sampled token
    assert hits(engine) == 40 + 12 - 1
    assert engine.stats().prefix_cache_queries_total == 40 + len(turn)
    expected = reference_logprobs(engine.model, turn, out.output_ids, 1.0)
    torch.testing.assert_close(torch.tensor(out.output_logprobs), expected)
    assert "vllm:prefix_cache_hits_total" in await engine.metrics_text()


async def test_a_shared_prefix_counts_even_where_the_turns_differ_after_it(make_engine) -> None:
    engine = make_engine()
    await engine.generate(req(prompt(40, 100)))
    other = prompt(30, 100) + prompt(20, 5000)  # its first 30 tokens are the kept ones
    out = await engine.generate(req(other, seed=3))
    assert hits(engine) == 30
    expected = reference_logprobs(engine.model, other, out.output_ids, 1.0)
    torch.testing.assert_close(torch.tensor(out.output_logprobs), expected)


async def update(engine, version: int = 1) -> None:
    g = torch.Generator().manual_seed(5)
    new = [
        (n, p.detach() + 0.05 * torch.randn(p.shape, generator=g))
        for n, p in engine.model.named_parameters()
    ]
    await engine.update_weights(new, weight_version=version)


async def test_a_weight_update_empties_the_cache(make_engine) -> None:
    engine = make_engine()
    turn, out = await two_turns(engine, between=update)
    assert hits(engine) == 0
    expected = reference_logprobs(engine.model, turn, out.output_ids, 1.0)
    torch.testing.assert_close(torch.tensor(out.output_logprobs), expected)


async def test_a_turn_that_ran_across_an_update_is_not_kept(make_engine) -> None:
    """Its K/V is part old weights, part new: a next turn must not reuse it."""
    engine = make_engine()
    first = prompt(40, 100)
    running = asyncio.create_task(engine.generate(req(first, new=200)))
    await wait_until(lambda: engine.stats().generation_tokens_total >= 20)
    await update(engine)
    out = await running
    assert out.weight_version == 1  # it finished under the new weights
    turn = first + out.output_ids + prompt(10, 900)
    await engine.generate(req(turn, seed=1))
    assert hits(engine) == 0


async def test_kv_pressure_evicts_the_cache(make_engine) -> None:
    engine = make_engine(kv_cache_tokens=160)

    async def crowd(engine) -> None:  # 130 of the 160 tokens: no room left for the first turn
        await engine.generate(req(prompt(118, 3000), new=12))

    await two_turns(engine, between=crowd)
    assert hits(engine) == 0


async def test_no_cache_when_off_or_on_the_generic_path(make_engine) -> None:
    for engine in (make_engine(prefix_cache=False), make_engine(forward="generic")):
        await two_turns(engine)
        assert hits(engine) == 0
