"""What every gateway reply shares: native error responses (with `x-should-retry`), JSON bodies
read and written, engine errors classified for the caller, the end of a stream, and the access
log. Split from `server.py`, whose handlers use them."""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any

import orjson
from aiohttp import web

from tracerl.gateway.api import Dialect
from tracerl.gateway.generation import (
    Completion,
    EngineUnavailable,
    UntraceableReply,
    UpstreamError,
)

SESSION_PATH = re.compile(r"/s/([^/]*)(/.*)?")
TOKENS_KEY = web.RequestKey("tokens", tuple)
"""Where a generation leaves (prompt, completion) tokens for the access log."""
ENGINE_KEY = web.RequestKey("engine", tuple)
"""Where a generation leaves (engine, attempts), as the pool reported them (for its span)."""
STREAM_ERROR_KEY = web.RequestKey("stream_error", str)
"""Why a stream that had answered 200 ended in an error event (for the request's span)."""


def note_completion(request: web.Request, completion: Completion) -> None:
    """What a generation used, for the access log and the request's span."""
    request[TOKENS_KEY] = (completion.prompt_tokens, len(completion.ids))
    request[ENGINE_KEY] = (completion.served_by, completion.attempts)


def normalize_path(path: str) -> str:
    path = re.sub(r"/{2,}", "/", path)
    return path.rstrip("/") or "/"


def classify(error: Exception) -> tuple[int, str]:
    if isinstance(error, UpstreamError):
        return error.status, error.message
    if isinstance(error, EngineUnavailable):
        return 503, str(error)
    if isinstance(error, UntraceableReply):
        return 500, f"untraceable engine reply: {error}"
    return 500, f"internal gateway error: {error!r}"


def error_response(
    dialect: Dialect, status: int, message: str, param: str | None = None
) -> web.Response:
    """An error response in `dialect`'s shape; `x-should-retry: false` where sending the same
    request again cannot succeed (SDKs and agents honour it instead of retrying)."""
    final = (400 <= status < 500 and status not in (408, 429)) or status == 501
    headers = {"x-should-retry": "false"} if final else None
    return web.json_response(
        dialect.error_body(status, message, param), status=status, headers=headers
    )


@web.middleware
async def access_log_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """`METHOD PATH session=ID STATUS tokens=PROMPT+COMPLETION MS ms`, one line per request
    (the path without its query; the session from the path or `-`)."""
    started = time.monotonic()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as e:
        status = e.status
        raise
    finally:
        match = SESSION_PATH.fullmatch(normalize_path(request.path))
        sid = match.group(1)[:16] if match else "-"
        tokens = request.get(TOKENS_KEY)
        used = f"{tokens[0]}+{tokens[1]}" if tokens else "-"
        ms = (time.monotonic() - started) * 1000
        print(
            f"{request.method} {request.path} session={sid} {status} tokens={used} {ms:.0f} ms",
            flush=True,
        )


def orjson_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


async def read_json(request: web.Request, dialect: Dialect) -> Any:
    """The JSON body, or a native 400/413 error response."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return error_response(dialect, 413, "request body too large")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return error_response(dialect, 400, f"body is not valid JSON: {e}", "body")


async def close_stream(resp: web.StreamResponse) -> web.StreamResponse:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await resp.write_eof()
    return resp
