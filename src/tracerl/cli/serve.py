"""`tracerl engine` and `tracerl serve`: start the embedded engine behind the engine wire protocol.

`serve` is the by-hand entry point: it prints where the engine listens and answers a chat request
it prints too (`--demo` exits after that answer). The gateway will put OpenAI and Anthropic
surfaces in front of the same engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time

from tracerl.config import ConfigError, EngineCommandConfig

log = logging.getLogger("tracerl.serve")


def _build_engine(config: EngineCommandConfig):  # type: ignore[no-untyped-def]
    from tracerl.engine.forward import UnsupportedModelError
    from tracerl.engine.local import LocalEngine
    from tracerl.engine.types import RequestError
    from tracerl.models import ModelNotFoundError

    try:
        return LocalEngine(config.engine)
    except (ModelNotFoundError, UnsupportedModelError) as e:
        raise ConfigError(f"engine.model: {e}") from None
    except RequestError as e:
        raise ConfigError(str(e)) from None


async def _serve(config: EngineCommandConfig, demo: bool, prompt: str | None) -> int:
    from tracerl.engine.server import build_engine_app, start_server

    started = time.monotonic()
    engine = _build_engine(config)
    await engine.start()
    app = build_engine_app(engine, config.server.max_request_bytes)
    runner, port = await start_server(app, config.server.host, config.server.port)
    url = f"http://{config.server.host}:{port}"
    print(
        f"tracerl engine: model {config.engine.model} on {url} "
        f"(ready in {time.monotonic() - started:.1f} s)",
        flush=True,
    )
    try:
        if prompt is not None:
            await _answer_chat(engine, url, prompt)
        if demo:
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        return 0
    finally:
        await runner.cleanup()
        await engine.close()


async def _answer_chat(engine, url: str, prompt: str) -> None:  # type: ignore[no-untyped-def]
    """Render one chat turn with the model's template and send it over HTTP, printing both."""
    from tracerl.engine.client import EngineClient
    from tracerl.engine.types import GenerateRequest, SamplingParams

    messages = [{"role": "user", "content": prompt}]
    ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = list(ids["input_ids"])
    request = GenerateRequest(
        input_ids=ids, sampling_params=SamplingParams(max_new_tokens=64, temperature=0.0)
    )
    print(
        "request: POST "
        + url
        + "/generate "
        + json.dumps(
            {
                "messages": messages,
                "input_ids": f"[{len(ids)} ids]",
                "sampling_params": request.sampling_params.model_dump(exclude_none=True),
            }
        ),
        flush=True,
    )
    client = EngineClient(url)
    started = time.monotonic()
    try:
        out = await client.generate(request)
    finally:
        await client.close()
    elapsed = time.monotonic() - started
    print(
        f"answer ({out.completion_tokens} tokens, finish {out.finish_reason}, "
        f"{elapsed:.2f} s): {out.text.strip()}",
        flush=True,
    )
    print(
        f"try it: curl -s {url}/generate -d "
        f'\'{{"input_ids": {ids[:8]}, "sampling_params": {{"max_new_tokens": 8}}}}\'',
        flush=True,
    )


def run_engine(config: EngineCommandConfig) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve(config, demo=False, prompt=None))
    return 130


def run_serve(config: EngineCommandConfig, demo: bool, prompt: str) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve(config, demo=demo, prompt=prompt))
    return 130
