"""Configuration of span export (`[telemetry]`): where OpenTelemetry spans go, and how.

Off by default: with `otlp_endpoint` unset nothing is exported and opentelemetry is never
imported. No opentelemetry import here either: the CLI validates this before any heavy import.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from tracerl.config.base import Config

OtlpProtocol = Literal["http/protobuf", "grpc"]


class TelemetryConfig(Config):
    """OpenTelemetry spans of episodes, gateway requests, engine generations, trainer steps
    and weight syncs, exported over OTLP to an external collector (docs/telemetry.md)."""

    otlp_endpoint: str | None = None
    """The collector, as an http(s) URL: `http://HOST:4318` for http/protobuf (`/v1/traces` is
    appended to a URL without a path), `http://HOST:4317` for grpc (https: TLS). Unset: no
    spans (the default, and free)."""
    protocol: OtlpProtocol = "http/protobuf"
    """OTLP transport: protobuf over HTTP POST, or gRPC."""
    service_name: str = Field(default="tracerl", min_length=1)
    """The `service.name` resource attribute every span carries."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers (HTTP) or metadata (gRPC) sent with every export, e.g. a collector's
    authorization."""
    export_timeout_s: float = Field(default=10.0, gt=0)
    """Longest one export request may take; a collector that does not answer loses that batch,
    never blocks the run."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL with a host, got {v!r}")
        return v

    @property
    def enabled(self) -> bool:
        return self.otlp_endpoint is not None

    def traces_url(self) -> str:
        """Where spans are sent: for http/protobuf `/v1/traces` under an endpoint without a
        path (the collector's base URL), the endpoint as given otherwise."""
        assert self.otlp_endpoint is not None
        parts = urlsplit(self.otlp_endpoint)
        if self.protocol == "http/protobuf" and parts.path in ("", "/"):
            return self.otlp_endpoint.rstrip("/") + "/v1/traces"
        return self.otlp_endpoint
