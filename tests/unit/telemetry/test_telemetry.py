"""The `Telemetry` object: off never imports opentelemetry and hands out an inert span; on,
spans have explicit parents (a span, or a `traceparent` from another process) and never touch
OpenTelemetry's global provider. `traceparent` values are checked as the W3C spec says."""

from __future__ import annotations

import subprocess
import sys

from tracerl.config import TelemetryConfig
from tracerl.telemetry import INERT_SPAN, Telemetry, start_telemetry, valid_traceparent

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_valid_traceparent() -> None:
    assert valid_traceparent(GOOD) == GOOD
    assert valid_traceparent(GOOD.upper()) == GOOD
    for bad in (
        None,
        42,
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # unknown version
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span id
        "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",  # not hex
    ):
        assert valid_traceparent(bad) is None, bad


def test_off_is_inert() -> None:
    telemetry = start_telemetry(TelemetryConfig())
    assert type(telemetry) is Telemetry and not telemetry.enabled
    with telemetry.span("episode", attributes={"a": 1}) as span:
        span.set("b", 2)
        span.fail("x")
    assert span is INERT_SPAN and span.traceparent is None
    assert telemetry.force_flush()
    telemetry.shutdown()


def test_off_never_imports_opentelemetry() -> None:
    """The gateway, pool, runner and loop modules import, and spans run, with telemetry off,
    and opentelemetry stays out of the process (it need not even be installed)."""
    code = (
        "import sys\n"
        "import tracerl.gateway.server, tracerl.rollout.pool, tracerl.run.loop\n"
        "import tracerl.envs.command, tracerl.envs.cli_agents, tracerl.cli.gateway\n"
        "from tracerl.config import TrainCommandConfig\n"
        "from tracerl.telemetry import start_telemetry\n"
        "t = start_telemetry(TrainCommandConfig().telemetry)\n"
        "t.span('episode').end()\n"
        "t.shutdown()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_on_spans_have_explicit_parents_and_a_private_provider() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    # a collector nobody listens on: nothing is exported, spans are checked in memory
    config = TelemetryConfig(otlp_endpoint="http://127.0.0.1:9", export_timeout_s=1)
    telemetry = start_telemetry(config)
    assert telemetry.enabled
    memory = InMemorySpanExporter()
    telemetry.provider.add_span_processor(SimpleSpanProcessor(memory))  # type: ignore[attr-defined]
    root = telemetry.span("episode", attributes={"tracerl.env.name": "x", "skipped": None})
    child = telemetry.span("gateway.request", parent=root.traceparent, kind="server")
    grandchild = telemetry.span("engine.generate", parent=child, kind="client")
    orphan = telemetry.span("gateway.request", parent="not a traceparent")
    for span in (grandchild, child, orphan):
        span.end()
    root.fail("boom")
    root.end()
    spans = {(s.name, s.context.span_id): s for s in memory.get_finished_spans()}
    by_name = {name: s for (name, _), s in spans.items() if name != "gateway.request"}
    requests = [s for (name, _), s in spans.items() if name == "gateway.request"]
    episode, generate = by_name["episode"], by_name["engine.generate"]
    assert episode.parent is None and episode.status.status_code.name == "ERROR"
    assert dict(episode.attributes or {}) == {"tracerl.env.name": "x"}
    request = next(s for s in requests if s.parent is not None)
    assert request.parent.span_id == episode.context.span_id
    assert request.context.trace_id == episode.context.trace_id
    assert generate.parent.span_id == request.context.span_id
    unparented = next(s for s in requests if s.parent is None)
    assert unparented.context.trace_id != episode.context.trace_id
    assert f"{episode.context.trace_id:032x}" in str(root.traceparent)
    assert episode.resource.attributes["service.name"] == "tracerl"
    # never the global provider
    assert not isinstance(trace.get_tracer_provider(), type(telemetry.provider))  # type: ignore[attr-defined]
    telemetry.shutdown()
