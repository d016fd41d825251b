"""`tracerl engine`: the embedded engine behind the engine wire protocol."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from tracerl import eventloop
from tracerl.config import ConfigError, EngineCommandConfig, EngineConfig


def build_engine(config: EngineConfig) -> Any:
    """A `LocalEngine`, with model problems reported as configuration errors."""
    from tracerl.engine.forward import UnsupportedModelError
    from tracerl.engine.local import LocalEngine
    from tracerl.engine.types import RequestError
    from tracerl.models import ModelNotFoundError

    try:
        return LocalEngine(config)
    except (ModelNotFoundError, UnsupportedModelError) as e:
        raise ConfigError(f"engine.model: {e}") from None
    except RequestError as e:
        raise ConfigError(str(e)) from None


async def _engine_main(config: EngineCommandConfig, sim: bool) -> int:
    from tracerl.engine.server import (
        SHUTDOWN_TIMEOUT_S,
        build_engine_app,
        start_server,
        stop_engine_server,
    )

    started = time.monotonic()
    middlewares: tuple[Any, ...] = ()
    if sim:
        from tracerl.engine.sim import SimEngine, fault_middleware

        engine: Any = SimEngine(config.sim)
        middlewares = (fault_middleware(engine),)
    else:
        engine = build_engine(config.engine)
    await engine.start()
    app = build_engine_app(engine, config.server.max_request_bytes, middlewares)
    runner, port = await start_server(
        app, config.server.host, config.server.port, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    )
    eventloop.settle_heap()
    url = f"http://{config.server.host}:{port}"
    print(
        f"tracerl engine: model {'sim' if sim else config.engine.model} on {url} "
        f"(ready in {time.monotonic() - started:.1f} s)",
        flush=True,
    )
    print(
        f"try it: curl -s {url}/generate -d "
        '\'{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}}\'',
        flush=True,
    )
    try:
        await eventloop.wait_for_signal()
        return 0
    finally:
        # a paused engine held requests open until aiohttp's 60 s shutdown timeout, and a pool
        # resumed aborted ones on it again, so a server whose supervisor died outlived it by a
        # minute (CI's Ray engine-kill run)
        await stop_engine_server(app, runner)


def run_engine(config: EngineCommandConfig, sim: bool = False) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return eventloop.run(_engine_main(config, sim))
    return 130
