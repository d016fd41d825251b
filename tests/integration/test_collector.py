"""The metrics collector against real /metrics text from the embedded and simulated engines."""

from __future__ import annotations

import asyncio

from tracerl.config import SimEngineConfig
from tracerl.control.collector import MetricsCollector, capacity_tokens, parse_prometheus
from tracerl.engine.client import EngineClient
from tracerl.engine.server import build_engine_app, start_server
from tracerl.engine.sim import SimEngine
from tracerl.engine.types import GenerateRequest


def test_capacity_prefers_kv_cache_size_tokens_and_falls_back_to_blocks() -> None:
    both = parse_prometheus(
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="100",'
        'kv_cache_size_tokens="999"} 1.0\n'
    )
    assert capacity_tokens(both) == 999
    blocks = parse_prometheus('vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1\n')
    assert capacity_tokens(blocks) == 1600


async def test_collector_reads_the_sim_and_the_embedded_engine(make_engine) -> None:
    sim = SimEngine(
        SimEngineConfig(
            kv_cache_tokens=300, time_scale=1000.0, output_len_median=50, output_len_sigma=0.0
        )
    )
    runner, port = await start_server(build_engine_app(sim), "127.0.0.1", 0)
    sim_client = EngineClient(f"http://127.0.0.1:{port}")
    local = make_engine(kv_cache_tokens=4096)
    seen: list[list] = []
    dead = EngineClient("http://127.0.0.1:9", timeout_s=1)
    clock = [0.0]
    collector = MetricsCollector(
        {"sim": sim_client, "local": local, "dead": dead},
        lambda samples, now: seen.append(samples),
        timeout_s=2,
        clock=lambda: clock[0],
    )
    try:
        assert collector.generation_rate(None) == (None, None)  # nothing polled yet
        first = await collector.poll_once()
        rate, mark = collector.generation_rate(None)
        assert rate is None and mark == (0, 0.0)
        assert len(first) == 2 and collector.failed_polls == 1  # the dead one is skipped
        by_cap = {s.capacity_tokens: s for s in first}
        assert set(by_cap) == {300, 4096}
        assert by_cap[4096].max_model_len == local.max_model_len
        assert all(s.preemptions == 0 for s in first)  # no delta on the first poll
        await asyncio.gather(
            *(sim.generate(GenerateRequest(rid=f"x{i}", input_ids=[1] * 40)) for i in range(6))
        )
        assert collector.generation_rate(mark) == (None, mark)  # no poll since the mark
        clock[0] = 10.0
        second = await collector.poll_once()
        sim_sample = next(s for s in second if s.capacity_tokens == 300)
        assert sim_sample.preemptions > 0  # a delta since the previous poll
        assert collector.generated_tokens == 6 * 50  # vllm:generation_tokens_total, summed
        rate, mark = collector.generation_rate(mark)
        assert rate == 30.0 and mark == (300, 10.0)  # 300 tokens in 10 s
        clock[0] = 20.0
        third = await collector.poll_once()
        assert next(s for s in third if s.capacity_tokens == 300).preemptions == 0
        assert collector.generation_rate(mark) == (0.0, (300, 20.0))  # idle since
        assert len(seen) == 3
    finally:
        await sim_client.close()
        await dead.close()
        await runner.cleanup()
        await sim.close()
