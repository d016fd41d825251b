"""The engine wire protocol over HTTP (aiohttp), in front of any `Engine`.

Serves the SGLang-native routes of ARCHITECTURE.md. Bad requests get 400 with
`{"error": {"message", "field"}}` and the engine keeps serving. A client that disconnects from a
plain `/generate` aborts its request, so abandoned work does not occupy the batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from typing import Any

from aiohttp import web

from tracerl.engine.protocol import PAUSE_MODES, Engine
from tracerl.engine.types import GenerateRequest, RequestError, WeightLoadError

log = logging.getLogger(__name__)

ENGINE_KEY = web.AppKey("engine", Engine)
STOPPING_KEY = web.AppKey("stopping", asyncio.Event)
"""Set once the server is stopping: new generations get 503, so a client that resumes an
aborted request goes to another engine instead of waiting on this one."""

SHUTDOWN_TIMEOUT_S = 10.0
"""How long a stopping engine server waits for its open requests (already aborted) to end."""

STOP_DEADLINE_S = 30.0
"""How long a stopping engine server may take in all before it exits regardless: whoever told
it to stop (a supervisor's parent-death signal) may not be there to kill it."""


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"message": message, "code": status}
    if field is not None:
        body["field"] = field
    return web.json_response({"error": body}, status=status)


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError("body", f"not valid JSON: {e}") from None


def _sse(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def generate(request: web.Request) -> web.StreamResponse:
    if request.app[STOPPING_KEY].is_set():
        return _error(503, "engine is stopping")
    engine = request.app[ENGINE_KEY]
    try:
        req = GenerateRequest.from_wire(await _json_body(request))
        if not req.stream:
            return web.json_response((await engine.generate(req)).to_wire())
        stream = engine.generate_stream(req)
        first = await anext(stream)  # validation errors surface before the 200 is sent
    except RequestError as e:
        return _error(400, str(e), e.field)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        await response.write(_sse(first.to_wire()))
        async for chunk in stream:
            await response.write(_sse(chunk.to_wire()))
        await response.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, web.HTTPException):
        await stream.aclose()  # aborts the request in the engine
        raise
    except Exception as e:  # the stream ends with an error event and no [DONE]
        log.exception("generation failed mid-stream")
        await response.write(_sse({"error": {"message": str(e), "code": 500}}))
    await response.write_eof()
    return response


async def abort_request(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise RequestError("body", "expected a JSON object")
    engine = request.app[ENGINE_KEY]
    if body.get("abort_all"):
        count = await engine.abort(abort_all=True)
    elif isinstance(body.get("rid"), str):
        count = await engine.abort(body["rid"])
    else:
        raise RequestError("rid", "give a string rid or abort_all: true")
    return web.json_response({"aborted": count})


async def pause_generation(request: web.Request) -> web.Response:
    body = await _json_body(request) if request.can_read_body else {}
    mode = body.get("mode", "in_place") if isinstance(body, dict) else "in_place"
    if mode not in PAUSE_MODES:
        raise RequestError("mode", f"expected one of {', '.join(PAUSE_MODES)}, got {mode!r}")
    await request.app[ENGINE_KEY].pause(mode)
    return web.json_response({"paused": True, "mode": mode})


async def continue_generation(request: web.Request) -> web.Response:
    await request.app[ENGINE_KEY].resume()
    return web.json_response({"paused": False})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
        raise RequestError("model_path", "expected a string path")
    version = body.get("weight_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RequestError("weight_version", "expected an integer")
    engine = request.app[ENGINE_KEY]
    try:
        await engine.update_weights_from_disk(body["model_path"], version)
    except WeightLoadError as e:
        return web.json_response({"success": False, "message": str(e)}, status=400)
    return web.json_response({"success": True, "message": "updated", "weight_version": version})


async def load_lora_adapter(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise RequestError("body", "expected a JSON object")
    for key in ("lora_name", "lora_path"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise RequestError(key, "expected a non-empty string")
    version = body.get("weight_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RequestError("weight_version", "expected an integer")
    load = getattr(request.app[ENGINE_KEY], "load_lora_adapter", None)
    if load is None:
        raise RequestError("lora_name", "this engine does not load LoRA adapters")
    try:
        await load(body["lora_name"], body["lora_path"], version)
    except WeightLoadError as e:
        return web.json_response({"success": False, "message": str(e)}, status=400)
    return web.json_response({"success": True, "message": "loaded", "weight_version": version})


async def health(request: web.Request) -> web.Response:
    if await request.app[ENGINE_KEY].health():
        return web.json_response({"status": "ok"})
    return _error(503, "engine scheduler is not running")


async def health_generate(request: web.Request) -> web.Response:
    if await request.app[ENGINE_KEY].health_generate():
        return web.json_response({"status": "ok"})
    return _error(503, "engine cannot generate (paused or failing)")


async def get_model_info(request: web.Request) -> web.Response:
    return web.json_response(await request.app[ENGINE_KEY].model_info())


async def openapi(request: web.Request) -> web.Response:
    from tracerl.engine.openapi import engine_openapi

    return web.json_response(engine_openapi())


async def metrics(request: web.Request) -> web.Response:
    text = await request.app[ENGINE_KEY].metrics_text()
    return web.Response(
        text=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Prometheus-Format": "0.0.4"},
    )


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as e:
        return _error(400, str(e), e.field)
    except web.HTTPRequestEntityTooLarge as e:
        return _error(413, e.text or "request body too large")
    except web.HTTPException as e:
        if e.status >= 400:
            return _error(e.status, e.reason)
        raise
    except Exception as e:  # an engine failure: a JSON 500, and the server keeps serving
        log.exception("request %s %s failed", request.method, request.path)
        return _error(500, f"engine error: {e}")


def build_engine_app(
    engine: Engine, max_request_bytes: int = 64 * 1024 * 1024, middlewares: tuple[Any, ...] = ()
) -> web.Application:
    """The wire protocol in front of `engine`; `middlewares` run first (the simulated engine's
    fault injection)."""
    app = web.Application(client_max_size=max_request_bytes, middlewares=[*middlewares, _errors])
    app[ENGINE_KEY] = engine
    app[STOPPING_KEY] = asyncio.Event()
    app.router.add_post("/generate", generate)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    app.router.add_post("/load_lora_adapter", load_lora_adapter)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/get_model_info", get_model_info)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    return app


async def start_server(
    app: web.Application,
    host: str,
    port: int,
    cancel_on_disconnect: bool = True,
    shutdown_timeout: float = 60.0,
) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (0 picks a free port); return the runner and the bound port.

    With `cancel_on_disconnect` a handler is cancelled when its client disconnects (the engine
    then aborts that client's generation); the gateway turns it off so it can finish and record.
    `shutdown_timeout`: how long the runner's cleanup waits for open requests.
    """
    runner = web.AppRunner(
        app,
        handler_cancellation=cancel_on_disconnect,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, int(runner.addresses[0][1])


async def stop_engine_server(app: web.Application, runner: web.AppRunner) -> None:
    """Stop serving `app`'s engine: refuse new generations (503), end those in flight with
    "abort" (the pool resumes them on another engine: a paused engine would otherwise hold
    them, and the shutdown, open), close the server, then the engine. Past `STOP_DEADLINE_S`
    the process exits regardless."""
    deadline = _exit_after(STOP_DEADLINE_S)
    try:
        app[STOPPING_KEY].set()
        engine = app[ENGINE_KEY]
        await engine.abort(None, abort_all=True)
        await runner.cleanup()
        await engine.close()
    finally:  # stopped, or failed on the way, which ends the process with its error
        deadline.cancel()


def _exit_after(seconds: float) -> threading.Timer:
    def exit_now() -> None:
        print(f"engine server: not stopped after {seconds:.0f} s; exiting", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True
    timer.start()
    return timer
