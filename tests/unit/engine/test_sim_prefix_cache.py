"""The simulated engine's prefix cache, timed on the virtual clock: a turn that extends an earlier
one prefills only its new tokens, unless KV pressure evicted the earlier one."""

from __future__ import annotations

import asyncio
import random

from tracerl.bench.virtual_time import run_virtual
from tracerl.config import SimEngineConfig
from tracerl.engine.sim import SimEngine
from tracerl.engine.types import GenerateRequest, SamplingParams

PREFILL_S = 1e-3  # per token: prefill dominates every other cost here
STEP_S = 1e-3


def config(**overrides: object) -> SimEngineConfig:
    base: dict[str, object] = {
        "kv_cache_tokens": 4000,
        "prefill_s_per_token": PREFILL_S,
        "decode_step_s": STEP_S,
        "decode_step_s_per_request": 0.0,
        "output_len_median": 20.0,
        "output_len_sigma": 0.0,
    }
    return SimEngineConfig(**{**base, **overrides})  # type: ignore[arg-type]


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 40_000) for _ in range(n)]


async def first_token_s(engine: SimEngine, rid: str, ids: list[int]) -> tuple[float, list[int]]:
    loop = asyncio.get_running_loop()
    request = GenerateRequest(
        rid=rid, input_ids=ids, sampling_params=SamplingParams(max_new_tokens=20)
    )
    started, first, out = loop.time(), None, list(ids)
    async for chunk in engine.generate_stream(request):
        first = loop.time() - started if first is None else first
        out += chunk.output_ids
    assert first is not None
    return first, out


def second_turn_wait(cache: bool, pressure: bool) -> float:
    async def main() -> float:
        engine = SimEngine(config(prefix_cache=cache))
        _, context = await first_token_s(engine, "turn0", prompt(1000, 1))
        if pressure:  # other work fills the KV and evicts the finished turn
            await asyncio.gather(
                *(first_token_s(engine, f"other{i}", prompt(900, 10 + i)) for i in range(4))
            )
        wait, _ = await first_token_s(engine, "turn1", context + prompt(10, 2))
        await engine.close()
        return wait

    return run_virtual(main())


def test_an_extending_turn_prefills_only_its_new_tokens() -> None:
    cached = second_turn_wait(cache=True, pressure=False)
    uncached = second_turn_wait(cache=False, pressure=False)
    # 1030 tokens of context, of which 1020 were cached (the last prompt token always runs)
    assert cached < 20 * PREFILL_S
    assert uncached > 1000 * PREFILL_S


def test_kv_pressure_evicts_the_cache() -> None:
    assert second_turn_wait(cache=True, pressure=True) > 1000 * PREFILL_S


def later_turn_waits(update_before_last: bool) -> list[float]:
    """First-token waits of turns 2 and 3 of one episode, optionally after a weight update."""

    async def main() -> list[float]:
        engine = SimEngine(config())
        _, context = await first_token_s(engine, "turn0", prompt(1000, 1))
        waits = []
        for turn in (1, 2):
            if update_before_last and turn == 2:
                await engine.update_weights((), weight_version=1)
            wait, context = await first_token_s(engine, f"turn{turn}", context + prompt(10, turn))
            waits.append(wait)
        await engine.close()
        return waits

    return run_virtual(main())


def test_every_later_turn_hits_and_a_weight_update_empties_the_cache() -> None:
    assert all(wait < 20 * PREFILL_S for wait in later_turn_waits(update_before_last=False))
    second, third = later_turn_waits(update_before_last=True)
    assert second < 20 * PREFILL_S
    assert third > 1000 * PREFILL_S  # the K/V of the old weights serves no request
