"""The event loop our servers run on: uvloop where it is installed (about twice the request rate
of the stdlib loop for aiohttp on this machine), the stdlib loop elsewhere; and the wait for
SIGINT/SIGTERM a server runs until. The commands and the benchmarks share it; it imports no
other tracerl module."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import signal
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def settle_heap() -> None:
    """Move everything allocated so far (imported libraries, loaded models) out of the garbage
    collector's sight: a full collection would otherwise walk millions of long-lived objects and
    pause every request in flight for tens of milliseconds."""
    gc.collect()
    gc.freeze()


async def close_all(closers: Sequence[Callable[[], Any]], log: logging.Logger) -> None:
    """Call `closers` newest first, awaiting each that returns an awaitable; one that raises is
    logged and the others still run."""
    for close in reversed(closers):
        try:
            if inspect.isawaitable(outcome := close()):
                await outcome
        except Exception:
            log.exception("closing %r failed", close)


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # not on this platform: the stdlib loop works, only slower
        return asyncio.run(main)
    return uvloop.run(main)


async def wait_for_signal() -> None:
    """Returns once the process gets SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
