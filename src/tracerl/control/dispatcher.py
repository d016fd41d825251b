"""The dispatcher: runs episodes up to the in-flight cap, and sheds the youngest groups first.

Admission is smoothed by a burst window that meters net pool growth: within BURST_WINDOW_S at
most `max(group_size, cap / 4)` more episodes start than finish (a whole growth step of the
controller fits in one window; a start far above the engines' room ramps over a few windows).
Natural completions refund the window (steady replacement is never throttled); cancellations do
not (a mass shed must not hand its size back as burst budget while the overload drains).
Cancelling an episode cancels its task, which closes its engine requests; the pool and engines
abort them, so nothing keeps running. Episodes of a `never_shed` kind (the loop's eval) are
never chosen by `shed`: an eval must measure every task it was given; only `close` ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# Window over which admissions are metered.
BURST_WINDOW_S = 1.0
# Share of the cap that may be admitted net per window (at least a group).
BURST_SHARE = 0.25
# How often a submit held by a spent burst window looks at it again.
WINDOW_RECHECK_S = 0.05


class DispatcherClosed(RuntimeError):
    """`submit` after (or while waiting during) `close()`."""


@dataclass
class Episode:
    """One rollout: `group` ties the samples of one prompt together and is what shedding ranks
    by age (the loop's: training groups count up from 0, eval groups down from -1); `kind` is
    train or eval; `payload` is the runner's."""

    episode_id: str
    group: int
    env: str = "default"
    kind: str = "train"
    payload: Any = None


@dataclass
class Finished:
    """An episode that ended: its runner's value and cost, its error, or its cancellation."""

    episode: Episode
    tokens: int
    duration_s: float
    value: Any = None
    error: BaseException | None = None
    cancelled: bool = False


class Dispatcher:
    def __init__(
        self,
        run: Callable[[Episode], Awaitable[tuple[Any, int]]],
        *,
        cap: int,
        group_size: int = 1,
        on_complete: Callable[[Finished], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        never_shed: frozenset[str] = frozenset(),
    ) -> None:
        self.run = run
        self.never_shed = never_shed
        self.cap = cap
        self.group_size = group_size
        self.on_complete = on_complete or (lambda result: None)
        self.clock = clock
        self._running: dict[str, tuple[Episode, float, asyncio.Future[Any]]] = {}
        self._window: list[tuple[float, int]] = []  # (time, +1 admission / -1 refund)
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def inflight(self) -> int:
        return len(self._running)

    def inflight_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for episode, _, _ in self._running.values():
            counts[episode.kind] = counts.get(episode.kind, 0) + 1
        return counts

    def eval_share(self) -> float:
        return self.inflight_by_kind().get("eval", 0) / self.inflight if self.inflight else 0.0

    def set_limit(self, cap: int) -> None:
        self.cap = cap
        self._changed.set()

    def _burst_budget(self, now: float) -> float:
        self._window = [(t, d) for t, d in self._window if now - t < BURST_WINDOW_S]
        net = sum(d for _, d in self._window)
        return max(self.group_size, self.cap * BURST_SHARE) - net

    async def submit(self, episode: Episode) -> None:
        """Wait for room under the cap and the burst window, then start `episode`.

        Raises `DispatcherClosed` once `close()` was called, even for a submit already waiting:
        closing must not depend on every feeder's cancellation arriving."""
        while True:
            if self._closed:
                raise DispatcherClosed("the dispatcher is closed")
            now = self.clock()
            recheck_s: float | None = None  # at the cap: only a completion or a new cap helps
            if self.inflight < self.cap:
                if self._burst_budget(now) >= 1:
                    break
                # The window is spent: look again every WINDOW_RECHECK_S. (Waking exactly when
                # its oldest entry leaves it was tried: it admits up to a recheck sooner, and on
                # `tracerl bench concurrency` the heavy-tailed workload started high then took
                # 11 steps to settle, against a target of 10, with 133 preemptions for 51.)
                recheck_s = WINDOW_RECHECK_S
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(recheck_s):
                    await self._changed.wait()
        self._window.append((now, 1))
        task = asyncio.ensure_future(self.run(episode))
        self._running[episode.episode_id] = (episode, now, task)
        # a done callback, not code inside the task: a task cancelled before it first runs
        # never executes its body, and would otherwise stay counted as in flight forever
        task.add_done_callback(functools.partial(self._finished, episode, now))

    def _finished(self, episode: Episode, started: float, task: asyncio.Future[Any]) -> None:
        duration = self.clock() - started
        if task.cancelled():
            result = Finished(episode, 0, duration, cancelled=True)
        elif task.exception() is not None:  # a failed episode: reported, never trained on
            result = Finished(episode, 0, duration, error=task.exception())
        else:
            value, tokens = task.result()
            result = Finished(episode, tokens, duration, value)
        self._running.pop(episode.episode_id, None)
        if not result.cancelled:
            self._window.append((self.clock(), -1))  # natural completions refund admission
        self._changed.set()
        self.on_complete(result)

    def shed(self, count: int, kind: str | None = None) -> list[str]:
        """Cancel up to `count` episodes (of `kind` only, when given; never of a `never_shed`
        kind), youngest groups first (a group is as old as its oldest member: long-running
        groups carry the most sunk cost)."""
        return self._cancel(count, kind, self.never_shed)

    def _cancel(self, count: int, kind: str | None, spare: frozenset[str]) -> list[str]:
        groups: dict[int, float] = {}
        for episode, started, _ in self._running.values():
            if (kind is None or episode.kind == kind) and episode.kind not in spare:
                groups[episode.group] = min(groups.get(episode.group, started), started)
        victims: list[str] = []
        for group in sorted(groups, key=lambda g: groups[g], reverse=True):
            members = [(eid, s) for eid, (e, s, _) in self._running.items() if e.group == group]
            for eid, _ in sorted(members, key=lambda m: m[1], reverse=True):
                if len(victims) >= count:
                    break
                victims.append(eid)
            if len(victims) >= count:
                break
        for eid in victims:
            self._running[eid][2].cancel()
        return victims

    async def close(self) -> None:
        """Stop admitting, cancel everything in flight, and wait until it has ended."""
        self._closed = True
        self._changed.set()
        self._cancel(len(self._running), None, frozenset())
        await self.drain()

    async def drain(self) -> None:
        while self._running:
            await asyncio.gather(
                *(t for _, _, t in list(self._running.values())), return_exceptions=True
            )
