"""A test agent that traces itself with the OpenTelemetry SDK, as an instrumented agent would.

It continues the trace in `TRACEPARENT` (the episode's) with a span of its own, `agent.run`,
sends one chat request carrying that span as its `traceparent` header, exports its span to
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (flushed before it exits) and prints reward 1 with the
`TRACEPARENT` it was given.
"""

from __future__ import annotations

import json
import os
import sys

import openai
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def main() -> None:
    task = json.loads(sys.stdin.readline())
    given = os.environ.get("TRACEPARENT", "")
    propagator = TraceContextTextMapPropagator()
    provider = TracerProvider(resource=Resource.create({"service.name": "traced-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))  # the env's endpoint
    tracer = provider.get_tracer("traced-agent")
    parent = propagator.extract({"traceparent": given})
    with tracer.start_as_current_span("agent.run", context=parent):
        headers: dict[str, str] = {}
        propagator.inject(headers)  # the current span: agent.run
        client = openai.OpenAI(max_retries=0, timeout=60)
        client.chat.completions.create(
            model="agent-model",
            messages=[{"role": "user", "content": task["prompt"]}],
            max_tokens=4,
            extra_headers=headers,
        )
    provider.shutdown()  # exported before the episode ends
    print(json.dumps({"reward": 1.0, "metrics": {"had_traceparent": bool(given)}}))


if __name__ == "__main__":
    main()
