"""`tracerl view`: serve the trace viewer over a run directory until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import time

from tracerl import eventloop
from tracerl.config import ViewConfig


async def _view_main(config: ViewConfig) -> int:
    from tracerl.view.server import start

    started = time.monotonic()
    runner, url = await start(config)
    # SIGINT/SIGTERM handled before the URL is announced: whoever waits for it may stop us
    stopped = asyncio.create_task(eventloop.wait_for_signal())
    await asyncio.sleep(0)
    print(
        f"tracerl view: {config.run_dir} on {url} (ready in {time.monotonic() - started:.1f} s)"
        + ("; admin key required" if config.admin_key else ""),
        flush=True,
    )
    try:
        await stopped
        return 0
    finally:
        await runner.cleanup()


def run_view(config: ViewConfig) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return eventloop.run(_view_main(config))
    return 130
