"""The gateway's `gateway.request` spans: what one generation request tells telemetry.

A request's span is a child of its `traceparent` header when that is a valid W3C value (an
agent that traces itself), else of its session's trace context (the episode that opened the
session), else the root of a trace of its own. It carries the session, the endpoint, the
tokens (OpenTelemetry's `gen_ai.usage.*` names), the engine that served it and the retries
(as the pool reported them on its chunks), the status code and the outcome; the pool's
`engine.generate` child has the detail of the attempts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from tracerl.gateway.replies import ENGINE_KEY, STREAM_ERROR_KEY, TOKENS_KEY
from tracerl.gateway.session import SessionState
from tracerl.telemetry import INERT_SPAN, Span, Telemetry, valid_traceparent


async def request_span(
    telemetry: Telemetry,
    request: web.Request,
    sid: str | None,
    endpoint: str,
    session: Callable[[str], Awaitable[SessionState | None]],
) -> Span:
    """The started span of a generation request (the inert one when telemetry is off);
    `session`: the gateway's lookup of a session's state (for its trace context)."""
    if not telemetry.enabled:
        return INERT_SPAN
    header = valid_traceparent(request.headers.get("traceparent"))
    state = await session(sid) if sid is not None and header is None else None
    inherited = state.traceparent if state is not None else None
    return telemetry.span(
        "gateway.request",
        parent=header or inherited,
        kind="server",
        attributes={
            "tracerl.session.id": sid,
            "tracerl.gateway.endpoint": endpoint,
            "tracerl.gateway.traced": sid is not None,
            "tracerl.gateway.parent": "header" if header else "session" if inherited else None,
            "http.request.method": request.method,
            "url.path": request.path,
        },
    )


def end_request_span(span: Span, request: web.Request, response: web.StreamResponse | None) -> None:
    """Its tokens, status and outcome, then ended; a 5xx (or a stream that ended in an error
    event after its 200) is status ERROR."""
    if span is INERT_SPAN:
        return
    tokens = request.get(TOKENS_KEY)
    if tokens:
        span.update(
            {"gen_ai.usage.input_tokens": tokens[0], "gen_ai.usage.output_tokens": tokens[1]}
        )
    engine, attempts = request.get(ENGINE_KEY, (None, 0))
    if engine is not None:  # behind a pool
        span.update({"tracerl.engine.id": engine, "tracerl.pool.retries": attempts - 1})
    status = response.status if response is not None else 500
    stream_error = request.get(STREAM_ERROR_KEY)
    span.set("http.response.status_code", status)
    if stream_error is not None or status >= 400:
        span.set(
            "tracerl.gateway.outcome", "error" if status >= 500 or stream_error else "rejected"
        )
        if stream_error is not None or status >= 500:
            span.fail(stream_error or f"HTTP {status}")
    else:
        span.set("tracerl.gateway.outcome", "ok")
    span.end()
