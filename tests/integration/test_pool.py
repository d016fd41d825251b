"""The engine pool over simulated engines: retries, resume, health, restarts, weight sync."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.waiting import wait_until
from tracerl.config import PoolConfig, SimEngineConfig, SimFaults
from tracerl.engine.client import EngineClient, EngineHTTPError
from tracerl.engine.server import build_engine_app, start_server
from tracerl.engine.sim import SimEngine, fault_middleware, sim_engine_command
from tracerl.engine.types import GenerateRequest, PoolError
from tracerl.rollout.launcher import ProcessLauncher
from tracerl.rollout.pool import EnginePool, Member

FAST = {"time_scale": 1000.0, "output_len_median": 30.0, "output_len_sigma": 0.3}


def req(rid: str, n: int | None = None, prompt: int = 8) -> GenerateRequest:
    return GenerateRequest(
        rid=rid,
        input_ids=list(range(1, prompt + 1)),
        sampling_params={"max_new_tokens": n, "ignore_eos": n is not None},
    )


@pytest.fixture
async def sims() -> AsyncIterator[Any]:
    started: list[tuple[Any, SimEngine, EngineClient]] = []

    async def build(n: int, faults: list[dict] | None = None, **overrides: Any) -> list[Member]:
        members = []
        for i in range(n):
            f = SimFaults(**((faults or [{}] * n)[i]))
            engine = SimEngine(SimEngineConfig(**{**FAST, **overrides}, seed=i, faults=f))
            await engine.start()  # as `tracerl engine --sim` does: timed faults start now
            app = build_engine_app(engine, middlewares=(fault_middleware(engine),))
            runner, port = await start_server(app, "127.0.0.1", 0)
            client = EngineClient(f"http://127.0.0.1:{port}", timeout_s=30)
            started.append((runner, engine, client))
            members.append(Member(f"sim{i}", client))
        return members

    yield build
    for runner, engine, client in started:
        await client.close()
        await runner.cleanup()
        await engine.close()


async def test_5xx_and_malformed_replies_move_to_a_healthy_engine(sims) -> None:
    members = await sims(3, faults=[{"error_rate": 1.0}, {"malformed_rate": 1.0}, {}])
    pool = EnginePool(members, PoolConfig(failure_threshold=2))
    outs = await asyncio.gather(*(pool.generate(req(f"s{i}", 12)) for i in range(12)))
    assert all(len(o.output_ids) == len(o.output_logprobs) == 12 for o in outs)
    assert pool.counters["retries"] > 0
    assert [m.active for m in pool.members] == [False, False, True]


async def test_4xx_is_not_retried_and_exhaustion_names_the_reasons(sims) -> None:
    members = await sims(2)
    pool = EnginePool(members)
    bad = GenerateRequest(rid="bad", input_ids=[10**6])
    with pytest.raises(EngineHTTPError) as err:
        await pool.generate(bad)
    assert err.value.status == 400 and pool.counters["retries"] == 0
    broken = await sims(2, faults=[{"error_rate": 1.0}] * 2)
    pool = EnginePool(broken, PoolConfig(max_attempts=3, failure_threshold=10))
    with pytest.raises(PoolError, match=r"failed on 3 attempts: sim\d: HTTP 503"):
        await pool.generate(req("doomed", 5))


async def test_a_hung_engine_is_detected_and_its_work_moves(sims) -> None:
    members = await sims(2, faults=[{"hang_at_s": 0.0}, {}])
    config = PoolConfig(
        health_interval_s=0.1, health_timeout_s=0.2, failure_threshold=2, request_timeout_s=0.5
    )
    pool = EnginePool(members, config)
    await pool.start()
    # liveness only: how fast it happens is `tracerl bench faults`' job
    await wait_until(lambda: not pool.members[0].active, "the hung engine taken out", 60)
    # taken out by its health checks, after exactly failure_threshold failures in a row
    assert pool.counters["deactivated"] == 1 and pool.members[1].active
    assert pool.members[0].failures >= config.failure_threshold
    assert len(pool.detection_s) == 1
    outs = await asyncio.gather(*(pool.generate(req(f"h{i}", 6)) for i in range(4)))
    assert all(len(o.output_ids) == 6 for o in outs)
    await pool.close()


async def test_weight_sync_under_load_loses_and_duplicates_nothing(sims, tmp_path) -> None:
    members = await sims(2, time_scale=50.0)  # 400 tokens take ~0.8 s of wall time
    pool = EnginePool(members, PoolConfig(update_mode="abort_resume"))
    streams = [pool.generate_stream(req(f"w{i}", 400)) for i in range(8)]
    firsts = [await anext(s) for s in streams]  # every request has begun on v0
    await pool.update_weights_from_disk(str(tmp_path), 1)
    outs = []
    for first, stream in zip(firsts, streams, strict=True):
        chunks = [first, *[c async for c in stream]]
        assert len({c.rid for c in chunks}) == 1
        ids = [t for c in chunks for t in c.output_ids]
        assert len(ids) == len([lp for c in chunks for lp in c.output_logprobs]) == 400
        outs.append(chunks[-1])
    assert sorted(o.rid for o in outs) == sorted(f"w{i}" for i in range(8))
    # requests aborted mid-way by the sync carry tokens from both versions, and say so
    assert all(o.weight_version == 1 and o.weight_version_min == 0 for o in outs)
    assert pool.counters["aborted_resumed"] == 8
    assert [m.weight_version for m in pool.members] == [1, 1]
    waiting = EnginePool(await sims(2, time_scale=50.0), PoolConfig(update_mode="wait"))
    tasks = [asyncio.create_task(waiting.generate(req(f"v{i}", 50))) for i in range(4)]
    await wait_until(lambda: sum(m.inflight for m in waiting.members) >= 4, "four generating")
    await waiting.update_weights_from_disk(str(tmp_path), 2)
    assert all(t.done() for t in tasks)  # the sync waited for them
    assert {(await t).weight_version for t in tasks} == {0}
    assert waiting.counters["aborted_resumed"] == 0


async def test_an_in_place_weight_sync_continues_every_request_and_labels_its_tokens(
    sims, tmp_path
) -> None:
    members = await sims(2, time_scale=50.0)  # 400 tokens take ~0.8 s of wall time
    pool = EnginePool(members, PoolConfig(update_mode="in_place"))
    streams = [pool.generate_stream(req(f"p{i}", 400)) for i in range(6)]
    firsts = [await anext(s) for s in streams]  # every request has begun on v0
    assert all(c.weight_version == 0 and c.finish_reason is None for c in firsts)
    await pool.update_weights_from_disk(str(tmp_path), 1)
    for first, stream in zip(firsts, streams, strict=True):
        chunks = [first, *[c async for c in stream]]
        ids = [t for c in chunks for t in c.output_ids]
        assert len(ids) == 400 and chunks[-1].finish_reason == "length"
        # tokens after the sync came from v1, and the reply says v0 sampled some of them
        assert chunks[-1].weight_version == 1 and chunks[-1].weight_version_min == 0
    assert pool.counters["aborted_resumed"] == 0  # nothing was aborted or recomputed
    assert [m.weight_version for m in pool.members] == [1, 1]


async def test_an_engine_that_cannot_take_weights_leaves_rotation(sims, tmp_path) -> None:
    members = await sims(2, faults=[{"fail_weight_updates": True}, {}])
    pool = EnginePool(members)
    await pool.update_weights_from_disk(str(tmp_path), 3)
    assert [m.active for m in pool.members] == [False, True]
    out = await pool.generate(req("after", 5))
    assert out.weight_version == 3  # never served by the stale engine


async def test_a_killed_launched_engine_loses_no_request_and_is_restarted() -> None:
    argv = sim_engine_command("--sim.time_scale=2", "--sim.decode_step_s=0.01")
    pool = await EnginePool.launch(
        [ProcessLauncher(argv), ProcessLauncher(argv)],
        config=PoolConfig(
            health_interval_s=0.2, health_timeout_s=1.0, failure_threshold=1, request_timeout_s=5.0
        ),
    )
    await pool.start()
    try:
        chunks: dict[str, list] = {f"k{i}": [] for i in range(6)}

        async def run(rid: str) -> None:
            async for chunk in pool.generate_stream(req(rid, 80)):
                chunks[rid].append(chunk)

        tasks = [asyncio.create_task(run(rid)) for rid in chunks]
        await wait_until(lambda: sum(len(c) for c in chunks.values()) >= 30, "30 chunks")
        victim = pool.members[0].launcher
        assert isinstance(victim, ProcessLauncher) and victim.process is not None
        victim.process.kill()  # kill -9 in the middle of generations
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for rid, got in chunks.items():
            ids = [t for c in got for t in c.output_ids]
            logprobs = [lp for c in got for lp in c.output_logprobs]
            assert len(ids) == len(logprobs) == 80, rid
            assert got[-1].finish_reason == "length" and got[-1].completion_tokens == 80
        assert pool.counters["resumes"] + pool.counters["retries"] > 0
        await wait_until(
            lambda: pool.counters["restarts"] >= 1 and pool.members[0].active,
            "the crashed engine restarted",
            90,
        )
        out = await pool.generate(req("after-restart", 5))
        assert len(out.output_ids) == 5
    finally:
        await pool.close()


async def test_launcher_waits_for_health_on_a_known_port() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = ProcessLauncher(
        sim_engine_command(port=port),
        url=f"http://127.0.0.1:{port}",
    )
    try:
        url = await launcher.start()
        client = EngineClient(url)
        assert await client.health()
        await client.close()
    finally:
        await launcher.stop()
    assert not launcher.alive()


async def test_in_process_engines_take_weights_without_disk(make_engine) -> None:
    import torch

    engines = [make_engine(), make_engine()]
    pool = EnginePool([Member(f"local{i}", e) for i, e in enumerate(engines)])
    r = GenerateRequest(
        rid="g",
        input_ids=[5, 6, 7],
        sampling_params={"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True},
    )
    before = await pool.generate(r)
    new = [
        (n, p.detach() * -1.0) if n == "lm_head.weight" else (n, p.detach())
        for n, p in engines[0].model.named_parameters()
    ]
    await pool.update_weights(None, 5, named_tensors=new)
    assert [e.weight_version for e in engines] == [5, 5]
    after = await pool.generate(r.model_copy(update={"rid": "h"}))
    assert after.weight_version == 5 and after.output_ids != before.output_ids
    with pytest.raises(ValueError, match="model_path: required"):
        await EnginePool([Member("x", EngineClient("http://127.0.0.1:9"))]).update_weights(
            None, 6, named_tensors=new
        )
    head = dict(new)["lm_head.weight"]
    assert all(torch.equal(e.model.lm_head.weight, head) for e in engines)


async def test_requests_wait_for_a_restarting_engine_instead_of_failing() -> None:
    argv = sim_engine_command("--sim.time_scale=2", "--sim.decode_step_s=0.01")
    pool = await EnginePool.launch(
        [ProcessLauncher(argv)],
        config=PoolConfig(
            health_interval_s=0.2, failure_threshold=1, request_timeout_s=5.0,
            no_engine_wait_s=0.1,  # far shorter than a restart
        ),
    )  # fmt: skip
    await pool.start()
    try:
        launcher = pool.members[0].launcher
        assert isinstance(launcher, ProcessLauncher) and launcher.process is not None
        launcher.process.kill()
        await wait_until(lambda: pool.members[0].restarting, "the restart begun")
        out = await asyncio.wait_for(pool.generate(req("during-restart", 5)), 60)
        assert len(out.output_ids) == 5 and pool.counters["restarts"] == 1
    finally:
        await pool.close()


async def test_attach_follows_a_new_set_of_engine_urls(sims) -> None:
    members = await sims(3)
    url = [str(m.engine.base_url) for m in members]  # type: ignore[attr-defined]
    clients = {u: m.engine for u, m in zip(url, members, strict=True)}
    pool = EnginePool([Member(u, clients[u]) for u in url[:2]], client=clients.__getitem__)
    first = await pool.generate(req("s-1", 4))
    assert len(first.output_ids) == 4
    sticky = pool._affinity["s"].name
    pool.attach([u for u in url if u != sticky])  # that engine was replaced by the third
    assert [m.name for m in pool.members] == [u for u in url[:2] if u != sticky] + [url[2]]
    assert [m.active for m in pool.members] == [True, True]
    outs = [await pool.generate(req(f"s-{i}", 4)) for i in range(2, 6)]  # the session moves
    assert all(len(o.output_ids) == 4 for o in outs)
    assert pool._affinity["s"].name != sticky
    pool.attach(url[2:])
    assert [m.name for m in pool.members] == url[2:]
    await pool.close()


class Delivering:
    """A launcher that loads weights itself (as a Ray engine actor does) into `engine`; while
    `gate` is set, a load waits for it to open."""

    ready_timeout_s = 5.0

    def __init__(self, engine: Any, weights_dir: str) -> None:
        self.engine, self.weights_dir = engine, weights_dir
        self.loads: list[tuple[str, int]] = []
        self.up = True
        self.gate: asyncio.Event | None = None

    async def start(self) -> str:
        self.up = True
        return str(self.engine.base_url)

    async def stop(self) -> None:
        self.up = False

    def alive(self) -> bool:
        return self.up

    async def load_weights(self, path: str, version: int) -> None:
        self.loads.append((path, version))
        if self.gate is not None:
            await self.gate.wait()
        await self.engine.update_weights_from_disk(self.weights_dir, version)  # its node's copy


async def test_a_launcher_that_delivers_weights_is_used_for_syncs_and_restarts(
    sims, tmp_path
) -> None:
    (member,) = await sims(1)
    engine = member.engine

    launcher = Delivering(engine, str(tmp_path))
    pool = EnginePool(
        [Member("launched-0", engine, launcher)],
        PoolConfig(health_interval_s=0.05, failure_threshold=1),
        client=lambda _: engine,
    )
    await pool.update_weights("object-store:v3", 3)
    assert launcher.loads == [("object-store:v3", 3)] and pool.members[0].weight_version == 3
    await pool.start()
    try:
        launcher.up = False  # the actor died: the pool restarts it at the current weights
        await wait_until(lambda: pool.counters["restarts"] >= 1, "the engine restarted", 30)
        assert launcher.loads == [("object-store:v3", 3)] * 2
        out = await pool.generate(req("after", 3))
        assert out.weight_version == 3
    finally:
        await pool.close()


async def test_a_push_during_a_restart_reaches_the_restarted_engine(sims, tmp_path) -> None:
    """The Ray CI failure: an engine restarted while the trainer pushed new weights loaded the
    old ones, yet was put back as holding the new (the push skipped it: not active yet)."""
    steady, restarted = await sims(2)
    launcher = Delivering(restarted.engine, str(tmp_path))
    pool = EnginePool(
        [steady, Member("launched-0", restarted.engine, launcher)],
        PoolConfig(health_interval_s=0.05, failure_threshold=1),
        client=lambda _: restarted.engine,
    )
    await pool.update_weights(str(tmp_path), 1)
    await pool.start()
    try:
        launcher.gate = asyncio.Event()
        launcher.up = False  # the actor died; its restart loads v1 and waits at the gate
        await wait_until(lambda: len(launcher.loads) == 2, "the restart loading", 30)
        push = asyncio.create_task(pool.update_weights(str(tmp_path), 2))
        await asyncio.sleep(0)  # the push starts while the restart is still loading v1
        launcher.gate.set()
        await asyncio.wait_for(push, 30)
        await wait_until(lambda: pool.counters["restarts"] >= 1, "the engine restarted", 30)
        assert launcher.loads[-1] == (str(tmp_path), 2)
        assert [m.weight_version for m in pool.members] == [2, 2]
        assert all(m.active for m in pool.members)
        out = await restarted.engine.generate(req("on-the-restarted", 3))
        assert out.weight_version == 2  # the engine itself serves the pushed weights
    finally:
        await pool.close()
