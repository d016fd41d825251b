"""The dispatcher: the cap, the burst window and its refunds, youngest-first shedding."""

from __future__ import annotations

import asyncio

from tracerl.control.dispatcher import (
    BURST_WINDOW_S,
    WINDOW_RECHECK_S,
    Dispatcher,
    Episode,
    Finished,
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_admits_up_to_the_cap_which_can_change() -> None:
    release = asyncio.Event()

    async def run(ep: Episode) -> tuple[str, int]:
        await release.wait()
        return ep.episode_id, 10

    results: list[Finished] = []
    d = Dispatcher(run, cap=2, group_size=100, on_complete=results.append)
    submits = [asyncio.create_task(d.submit(Episode(f"e{i}", i))) for i in range(4)]
    await settle()
    assert d.inflight == 2 and sum(t.done() for t in submits) == 2
    d.set_limit(3)  # wakes the waiting submits at once: no polling interval involved
    await settle()
    assert d.inflight == 3
    release.set()
    await asyncio.wait_for(asyncio.gather(*submits), 5)
    await d.drain()
    assert len(results) == 4 and all(r.tokens == 10 for r in results)


async def test_burst_window_meters_net_growth_and_refunds_only_completions() -> None:
    clock = Clock()
    release = asyncio.Event()

    async def run(ep: Episode) -> tuple[None, int]:
        if ep.kind == "instant":
            return None, 5
        await release.wait()
        return None, 5

    d = Dispatcher(run, cap=40, group_size=4, clock=clock)  # budget max(4, 40 x 0.25) = 10
    for i in range(10):
        await d.submit(Episode(f"a{i}", 0))
    blocked = asyncio.create_task(d.submit(Episode("a10", 0)))
    await settle()
    assert not blocked.done()  # the window is spent
    d.set_limit(d.cap)  # a wake-up re-checks, as the window's periodic re-check would
    await settle()
    assert not blocked.done()  # still spent: the (virtual) clock has not moved
    cancelled = d.shed(3)
    await settle()
    assert len(cancelled) == 3 and not blocked.done()  # cancellations refund nothing
    release.set()  # the remaining 7 complete naturally: each refunds one admission
    await asyncio.wait_for(blocked, 30)  # completions of the running ones refunded budget
    clock.t += BURST_WINDOW_S
    await d.drain()


async def test_shedding_takes_the_youngest_groups_first() -> None:
    clock = Clock()

    async def run(ep: Episode) -> tuple[None, int]:
        await asyncio.Event().wait()
        return None, 0

    results: list[Finished] = []
    d = Dispatcher(run, cap=100, group_size=100, clock=clock, on_complete=results.append)
    # group "old" has one member started at t=0 and one at t=30: its age is its oldest member's
    starts = [("old", 0.0), ("mid", 10.0), ("young", 20.0), ("old", 30.0), ("young", 25.0)]
    ids = {"old": 0, "mid": 1, "young": 2}
    for i, (group, t) in enumerate(starts):
        clock.t = t
        await d.submit(Episode(f"{group}{i}", ids[group]))
    victims = d.shed(3)
    assert victims == ["young4", "young2", "mid1"]
    await settle()
    assert sorted(r.episode.episode_id for r in results) == sorted(victims)
    assert all(r.cancelled and r.tokens == 0 for r in results)
    d.shed(10)
    await d.drain()


async def test_shedding_can_spare_another_kind() -> None:
    async def run(ep: Episode) -> tuple[None, int]:
        await asyncio.Event().wait()
        return None, 0

    d = Dispatcher(run, cap=10, group_size=10)
    await d.submit(Episode("t0", 0))
    await d.submit(Episode("e0", -1, kind="eval"))  # the youngest, but not train
    await d.submit(Episode("t1", 0))
    assert d.shed(5, kind="train") == ["t1", "t0"]
    await settle()
    assert d.inflight == 1 and d.inflight_by_kind() == {"eval": 1}
    d.shed(1)
    await d.drain()


async def test_eval_episodes_survive_an_overload_cut() -> None:
    """The loop's set-up: a HARD cut sheds the excess through `shed`, which never picks eval."""
    from tracerl.config import ConcurrencyConfig
    from tracerl.control.controller import ConcurrencyController, EngineLoad

    async def run(ep: Episode) -> tuple[None, int]:
        await asyncio.Event().wait()
        return None, 0

    clock = Clock()
    d = Dispatcher(run, cap=8, group_size=2, never_shed=frozenset({"eval"}), clock=clock)
    for i in range(4):
        clock.t += BURST_WINDOW_S  # the burst window never holds these back
        await d.submit(Episode(f"t{i}", i // 2))
        await d.submit(Episode(f"e{i}", -1 - i // 2, kind="eval"))  # younger than train
    controller = ConcurrencyController(
        ConcurrencyConfig(initial_inflight=8),
        set_limit=d.set_limit,
        on_overload=d.shed,
        get_inflight=lambda: d.inflight,
    )
    load = EngineLoad(10_000, 1000, 0.99, running=4, waiting=4, waiting_for_capacity=4,
                      preemptions=2)  # fmt: skip
    assert controller.observe([load], now=1.0) == "HARD"  # cut to 0.9 x 8 x 4/8 = 3
    await settle()
    assert d.cap == 3 and d.inflight_by_kind() == {"eval": 4}  # 5 over: every train one went
    await d.close()
    assert d.inflight == 0  # close ends eval too


async def test_close_stops_waiting_submitters_and_running_episodes() -> None:
    from tracerl.control.dispatcher import DispatcherClosed

    async def run(ep: Episode) -> tuple[None, int]:
        await asyncio.Event().wait()
        return None, 0

    results: list[Finished] = []
    d = Dispatcher(run, cap=1, group_size=1, on_complete=results.append)
    await d.submit(Episode("a", 0))
    waiting = asyncio.create_task(d.submit(Episode("b", 0)))
    await settle()
    await d.close()
    assert d.inflight == 0 and [r.cancelled for r in results] == [True]
    try:
        await asyncio.wait_for(waiting, 1)
    except DispatcherClosed:
        pass
    else:
        raise AssertionError("a waiting submit was admitted after close")


async def test_a_spent_window_is_rechecked_and_a_full_cap_waits_for_a_change(monkeypatch) -> None:
    from tracerl.control import dispatcher as module

    waits: list[float | None] = []
    real_timeout = asyncio.timeout

    def timeout(delay: float | None):  # type: ignore[no-untyped-def]
        waits.append(delay)
        return real_timeout(delay)

    monkeypatch.setattr(module.asyncio, "timeout", timeout)

    async def run(ep: Episode) -> tuple[None, int]:
        await asyncio.Event().wait()
        return None, 0

    clock = Clock()
    d = Dispatcher(run, cap=40, group_size=4, clock=clock)  # budget 10 per window
    for i in range(10):
        await d.submit(Episode(f"a{i}", 0))
    clock.t = 0.25
    blocked = asyncio.create_task(d.submit(Episode("a10", 0)))
    await settle()
    assert not blocked.done()
    # the window is looked at again on a short timer; at the cap there is no timer at all
    assert waits and all(w == WINDOW_RECHECK_S for w in waits)
    clock.t = BURST_WINDOW_S
    d.set_limit(d.cap)  # (the timer's wake-up, without waiting for it)
    await asyncio.wait_for(blocked, 30)
    at_cap = asyncio.create_task(d.submit(Episode("b", 0)))
    d.set_limit(d.inflight)
    waits.clear()
    await settle()
    assert not at_cap.done() and waits == [None]  # at the cap only a completion can help
    d.shed(20)
    d.set_limit(40)
    await asyncio.wait_for(at_cap, 30)
    d.shed(20)
    await d.drain()
