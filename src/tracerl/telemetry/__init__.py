"""Span export as one explicit object: `Telemetry`, built from `[telemetry]` and handed to the
gateway, the engine pool, the episode runner and the loop.

Owns: starting and ending spans with explicit parents (never OpenTelemetry's ambient context,
which async generators and tasks would carry to the wrong place), the W3C `traceparent` that
carries a trace between processes (a session's, a request's header, an agent's `TRACEPARENT`),
and flushing at shutdown. Does not own what the spans say: each caller sets its attributes.

Off (`otlp_endpoint` unset) is `Telemetry()`: every span is one inert object whose methods do
nothing, and opentelemetry is never imported. On is `tracerl.telemetry.otlp.OtlpTelemetry`, with
a tracer provider of its own (not the global one: several runs or tests in one process keep
their spans apart).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tracerl.config.telemetry import TelemetryConfig

AttributeValue = str | bool | int | float
SpanKind = Literal["internal", "server", "client"]

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def valid_traceparent(value: object) -> str | None:
    """`value` when it is a W3C trace-context `traceparent` (version 00, non-zero ids), else
    None: a malformed header is ignored, as the W3C spec asks, rather than failing a request."""
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT.fullmatch(value.strip().lower())
    if match is None or not int(match.group(1), 16) or not int(match.group(2), 16):
        return None
    return match.group(0)


def trace_id_of(traceparent: str) -> str:
    """The 32 hex digits of a valid `traceparent`'s trace id."""
    return traceparent.split("-")[1]


class Span:
    """A started span. This base is the inert one telemetry-off hands out; `end` must be called
    once (or the span used as a context manager, which records an escaping exception as the
    span's error; a cancellation, which here means shed or stopping, only as
    `tracerl.cancelled`)."""

    traceparent: str | None = None
    """This span as a W3C `traceparent`, for children in other processes (None when off)."""

    def set(self, name: str, value: AttributeValue | None) -> None:
        """One attribute; None is left out."""

    def update(self, attributes: Mapping[str, AttributeValue | None]) -> None:
        for name, value in attributes.items():
            self.set(name, value)

    def fail(self, reason: str) -> None:
        """Status ERROR with `reason`."""

    def end(self, end_ns: int | None = None) -> None:
        """Ended now (or at `end_ns`, wall clock); exported with the next batch."""

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(error, asyncio.CancelledError):
            self.set("tracerl.cancelled", True)
        elif error is not None:
            self.fail(describe(error))
        self.end()


INERT_SPAN = Span()


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class Telemetry:
    """Telemetry off: spans cost one method call that does nothing."""

    enabled = False

    def span(
        self,
        name: str,
        parent: Span | str | None = None,
        attributes: Mapping[str, AttributeValue | None] | None = None,
        kind: SpanKind = "internal",
        start_ns: int | None = None,
    ) -> Span:
        """A span started now (or at `start_ns`, wall clock), child of `parent` (a span of this
        process, or a `traceparent` from another); without one, the root of a new trace."""
        return INERT_SPAN

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export every ended span now; False if that did not finish within `timeout_s`."""
        return True

    def shutdown(self) -> None:
        """Flush and stop exporting (blocking: see `close`)."""

    async def close(self) -> None:
        """`shutdown` on a worker thread: a slow collector never stalls the event loop."""


def start_telemetry(config: TelemetryConfig | None) -> Telemetry:
    """Telemetry as `config` asks: off without an `otlp_endpoint` (no import of
    opentelemetry), else exporting to it."""
    if config is None or config.otlp_endpoint is None:
        return Telemetry()
    from tracerl.telemetry.otlp import OtlpTelemetry

    return OtlpTelemetry(config)


__all__ = [
    "INERT_SPAN",
    "Span",
    "Telemetry",
    "describe",
    "start_telemetry",
    "trace_id_of",
    "valid_traceparent",
]
