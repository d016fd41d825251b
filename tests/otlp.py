"""OTLP receivers for the telemetry tests: what a collector would get, decoded.

`HttpReceiver` is an aiohttp server on 127.0.0.1 accepting `POST /v1/traces` with an
`ExportTraceServiceRequest` protobuf body; `GrpcReceiver` is a grpcio server implementing the
`TraceService/Export` call. Both keep every span they received as a `ReceivedSpan`.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tracerl.engine.server import start_server


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    status: str
    """UNSET, OK or ERROR."""
    status_message: str
    kind: str
    """SPAN_KIND_INTERNAL, _SERVER, _CLIENT, ..."""
    resource: dict[str, Any] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


def decode(body: bytes) -> list[ReceivedSpan]:
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
    return spans_of(request)


def spans_of(request: Any) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex() or None,
                        attributes=_attributes(span.attributes),
                        status=("UNSET", "OK", "ERROR")[span.status.code],
                        status_message=span.status.message,
                        kind=type(span).SpanKind.Name(span.kind),
                        resource=resource,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


class HttpReceiver:
    """OTLP/HTTP (protobuf) on 127.0.0.1, a free port; `url` is its base URL."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.headers: list[dict[str, str]] = []
        self.url = ""
        self._runner: Any = None

    async def start(self) -> HttpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner, port = await start_server(app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _export(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        assert request.headers["Content-Type"] == "application/x-protobuf"
        self.headers.append(dict(request.headers))
        self.spans += decode(body)
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    async def __aenter__(self) -> HttpReceiver:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: GrpcReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:  # the proto's name
        self.receiver.metadata.append(dict(context.invocation_metadata()))
        self.receiver.spans += spans_of(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class GrpcReceiver:
    """OTLP/gRPC on 127.0.0.1, a free port (a grpcio server on its own threads)."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc

        self.spans: list[ReceivedSpan] = []
        self.metadata: list[dict[str, str]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.url = f"http://127.0.0.1:{port}"
        self.server.start()

    def close(self) -> None:
        self.server.stop(grace=None)
