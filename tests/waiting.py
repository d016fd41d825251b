"""Bounded waits for a condition, and reading a Prometheus metric: what several tests share.

A wait polls its condition on the event loop until it holds or a deadline passes. The deadline
is a liveness bound (a loaded CI machine only makes the wait longer), never a measured duration.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str = "condition",
    timeout_s: float = 30.0,
) -> None:
    """Return once `condition()` (plain or async) is true; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout_s:.0f} s")
        await asyncio.sleep(0.01)


def metric(text: str, name: str) -> float:
    """The value of the sample `name` in a Prometheus text exposition."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise KeyError(name)
