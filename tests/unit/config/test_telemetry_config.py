"""`[telemetry]`: off by default, an http(s) endpoint or a clear error naming the field, and the
traces URL each protocol sends to."""

from __future__ import annotations

import pytest

from tracerl.config import (
    ConfigError,
    GatewayCommandConfig,
    ServeConfig,
    TelemetryConfig,
    TrainCommandConfig,
    load_config,
)


def test_off_by_default_in_every_command() -> None:
    for cls in (TrainCommandConfig, GatewayCommandConfig, ServeConfig):
        assert not cls().telemetry.enabled


def test_toml_and_dotted_overrides_set_it(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[telemetry]\notlp_endpoint = "http://127.0.0.1:4318"\n')
    config = load_config(TrainCommandConfig, path, ["--telemetry.protocol=grpc"])
    assert config.telemetry.otlp_endpoint == "http://127.0.0.1:4318"
    assert config.telemetry.protocol == "grpc" and config.telemetry.enabled
    serve = load_config(ServeConfig, None, ["telemetry.otlp_endpoint=https://collector:4318"])
    assert serve.telemetry.traces_url() == "https://collector:4318/v1/traces"


@pytest.mark.parametrize(
    "override, message",
    [
        ("telemetry.otlp_endpoint=localhost:4318", "telemetry.otlp_endpoint: Value error"),
        ("telemetry.otlp_endpoint=ftp://host/x", "expected an http:// or https:// URL"),
        ("telemetry.otlp_endpoint=http://", "with a host"),
        ("telemetry.protocol=thrift", "telemetry.protocol"),
        ("telemetry.export_timeout_s=0", "telemetry.export_timeout_s"),
        ("telemetry.endpoint=http://x", "telemetry.endpoint: unknown key"),
    ],
)
def test_bad_values_name_the_dotted_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("?", r"\?")):
        load_config(GatewayCommandConfig, None, [override])


def test_traces_url_per_protocol() -> None:
    def url(endpoint: str, protocol: str = "http/protobuf") -> str:
        return TelemetryConfig(otlp_endpoint=endpoint, protocol=protocol).traces_url()  # type: ignore[arg-type]

    assert url("http://h:4318") == "http://h:4318/v1/traces"
    assert url("http://h:4318/") == "http://h:4318/v1/traces"
    assert url("http://h:4318/custom/traces") == "http://h:4318/custom/traces"  # as given
    assert url("http://h:4317", "grpc") == "http://h:4317"
