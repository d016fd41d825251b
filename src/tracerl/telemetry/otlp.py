"""Telemetry on: OpenTelemetry's SDK exporting over OTLP (protobuf over HTTP, or gRPC).

Only `tracerl.telemetry.start_telemetry` imports this module, when `[telemetry] otlp_endpoint`
is set (the `telemetry` extra installs what it needs). One `TracerProvider` per `OtlpTelemetry`,
never installed as the global one; spans go through a `BatchSpanProcessor` (exports happen on
its thread, never on the event loop), and `shutdown` flushes what is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from tracerl.config.telemetry import TelemetryConfig
from tracerl.telemetry import (
    AttributeValue,
    Span,
    SpanKind,
    Telemetry,
    valid_traceparent,
)

_KINDS = {
    "internal": trace.SpanKind.INTERNAL,
    "server": trace.SpanKind.SERVER,
    "client": trace.SpanKind.CLIENT,
}


class OtlpSpan(Span):
    def __init__(self, span: trace.Span) -> None:
        self.span = span
        ctx = span.get_span_context()
        self.traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def set(self, name: str, value: AttributeValue | None) -> None:
        if value is not None:
            self.span.set_attribute(name, value)

    def fail(self, reason: str) -> None:
        self.span.set_status(Status(StatusCode.ERROR, reason))

    def end(self, end_ns: int | None = None) -> None:
        self.span.end(end_time=end_ns)


def exporter(config: TelemetryConfig) -> SpanExporter:
    """The OTLP span exporter for `config.protocol`."""
    headers = dict(config.headers)
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(
            endpoint=config.traces_url(), headers=headers, timeout=config.export_timeout_s
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(
        endpoint=config.traces_url(), headers=headers, timeout=config.export_timeout_s
    )


class OtlpTelemetry(Telemetry):
    enabled = True

    def __init__(self, config: TelemetryConfig) -> None:
        self.config = config
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name})
        )
        self.provider.add_span_processor(BatchSpanProcessor(exporter(config)))
        self.tracer = self.provider.get_tracer("tracerl")

    def span(
        self,
        name: str,
        parent: Span | str | None = None,
        attributes: Mapping[str, AttributeValue | None] | None = None,
        kind: SpanKind = "internal",
        start_ns: int | None = None,
    ) -> Span:
        span = self.tracer.start_span(
            name,
            context=_context(parent),
            kind=_KINDS[kind],
            attributes={k: v for k, v in (attributes or {}).items() if v is not None},
            start_time=start_ns,
        )
        return OtlpSpan(span)

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()

    async def close(self) -> None:
        await asyncio.to_thread(self.shutdown)


def _context(parent: Span | str | None) -> Context:
    """An explicit parent context: an empty one (a new trace) when there is no parent, never
    the ambient current context."""
    if isinstance(parent, OtlpSpan):
        return trace.set_span_in_context(parent.span, Context())
    traceparent = valid_traceparent(parent) if isinstance(parent, str) else None
    if traceparent is None:
        return Context()
    _, trace_id, span_id, flags = traceparent.split("-")
    remote = SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16))
    )
    return trace.set_span_in_context(NonRecordingSpan(remote), Context())
