"""The virtual-time loop jumps over idle time but keeps the order and spacing of timers."""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

import pytest

from tracerl.bench.virtual_time import VirtualTimeLoop, run_virtual


def test_sleeps_and_timeouts_cost_virtual_time_only(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> tuple[float, list[float], bool]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(1000)
        timed_out = False
        try:
            async with asyncio.timeout(5):
                await asyncio.Event().wait()
        except TimeoutError:
            timed_out = True

        async def at(delay: float) -> float:
            await asyncio.sleep(delay)
            return loop.time()

        woke = await asyncio.gather(*(at(d) for d in (0.3, 0.1, 0.2)))
        return loop.time(), woke, timed_out

    waits: list[float | None] = []  # every timeout the loop handed the OS's selector
    real_select = selectors.DefaultSelector.select

    def select(self: selectors.BaseSelector, timeout: float | None = None) -> list[Any]:
        waits.append(timeout)
        return real_select(self, timeout)  # type: ignore[arg-type]

    monkeypatch.setattr(selectors.DefaultSelector, "select", select)
    now, woke, timed_out = run_virtual(main())
    assert waits and set(waits) == {0}  # 1005 virtual seconds, and it never waited for real
    assert timed_out and now == pytest.approx(1005.3)
    assert woke == pytest.approx([1005.1 + 0.2, 1005.1, 1005.1 + 0.1])


def test_time_never_goes_backwards() -> None:
    loop = VirtualTimeLoop()
    try:
        with pytest.raises(ValueError, match="backwards"):
            loop.advance(-1.0)
    finally:
        loop.close()
