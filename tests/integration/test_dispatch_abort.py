"""Shedding an episode really stops its engine requests (abort through the pool)."""

from __future__ import annotations

from tests.waiting import wait_until
from tracerl.config import SimEngineConfig
from tracerl.control.dispatcher import Dispatcher, Episode
from tracerl.engine.client import EngineClient
from tracerl.engine.server import build_engine_app, start_server
from tracerl.engine.sim import SimEngine
from tracerl.engine.types import GenerateRequest
from tracerl.rollout.pool import EnginePool, Member


async def test_shed_episodes_abort_their_engine_requests() -> None:
    sim = SimEngine(
        SimEngineConfig(time_scale=20.0, output_len_median=10_000, output_len_sigma=0.0)
    )
    runner, port = await start_server(build_engine_app(sim), "127.0.0.1", 0)
    client = EngineClient(f"http://127.0.0.1:{port}")
    pool = EnginePool([Member("sim", client)])

    async def run(ep: Episode) -> tuple[None, int]:
        out = await pool.generate(GenerateRequest(rid=f"{ep.episode_id}-0", input_ids=[1, 2, 3]))
        return None, len(out.output_ids)

    dispatcher = Dispatcher(run, cap=8, group_size=8)
    try:
        for i in range(6):
            await dispatcher.submit(Episode(f"e{i}", i // 2))
        await wait_until(lambda: sim.stats().running >= 6, "six requests running")
        shed = dispatcher.shed(4)
        assert len(shed) == 4
        await wait_until(lambda: sim.stats().running == 2, "the shed requests aborted")
        assert sim.stats().finished_total.get("abort", 0) == 4
        assert dispatcher.inflight == 2
    finally:
        dispatcher.shed(10)
        await dispatcher.drain()
        await client.close()
        await runner.cleanup()
        await sim.close()
