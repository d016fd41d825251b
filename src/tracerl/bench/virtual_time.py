"""An asyncio event loop on a virtual clock, for discrete-event simulation.

`loop.time()` starts at 0 and moves only when every task is waiting: the loop then jumps straight
to the next scheduled timer instead of sleeping. Simulated engines, the dispatcher, the controller
and the collector all read time from the loop (`asyncio.sleep`, `asyncio.timeout`, `loop.time()`),
so under this loop a simulated step of 30 ms costs 30 ms of simulated time whatever the Python
work around it costs in wall time: benchmark figures measure the policy, not the interpreter.

Only for in-process work. Real sockets still function (the loop checks them without blocking
before each jump), but their latency is not on the virtual clock.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing scheduled: only I/O or another thread can wake the loop
            return super().select(None)
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_JumpSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time cannot go backwards ({seconds} s)")
        self._virtual_now += seconds


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on a fresh virtual-time loop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)
