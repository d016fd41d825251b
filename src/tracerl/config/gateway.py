"""Configuration of the gateway and of `tracerl serve` (embedded engine + gateway)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tracerl.config.base import Config
from tracerl.config.engine import EngineConfig
from tracerl.config.pool import PoolConfig
from tracerl.config.telemetry import TelemetryConfig

ChatFormatName = Literal[
    "auto", "hermes", "qwen3_coder", "llama3", "mistral", "deepseek", "glm", "harmony"
]


class GatewayConfig(Config):
    model: str = "tiny"
    """Model whose tokenizer and chat template render requests (the engines' model)."""

    chat_template: str | None = None
    """A chat template replacing the model's own (a model without one needs it): a built-in
    name (chatml, gemma: `tracerl.chat_templates`) or a Jinja file."""

    chat_format: ChatFormatName = "auto"
    """How replies write tool calls and reasoning (`tracerl.formats`): `auto` reads it from the
    chat template; or hermes, qwen3_coder, llama3, mistral, deepseek, glm, harmony."""

    engine_urls: list[str] = Field(default_factory=list)
    """Running engines to attach to (`--engine-url`), of the kind `engine.backend` names; unset:
    `tracerl gateway` launches `engine.count` engines of that backend."""

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default so nothing is exposed by accident."""

    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port; 0 picks a free one (printed at start)."""

    store: str = "traces.sqlite"
    """The trace store: a SQLite file, or a `postgresql://user@host:port/db` URL (a server
    several gateways share; needs the `[postgres]` extra)."""

    store_synchronous: Literal["normal", "full"] = "normal"
    """`normal` survives a killed process; `full` also survives power loss (one fsync a turn)."""

    admin_key: str | None = None
    """Key for session administration and untraced use; unset generates one and prints it."""

    system_prompt: str | None = None
    """Prepended to every session's messages, and recorded like any other prompt token."""

    history: Literal["extend", "template"] = "extend"
    """A chat template that renders an earlier reply differently than it was sampled (Qwen3's
    and GLM's drop reasoning once a user message follows): `extend` keeps the session's turns
    one trajectory (the recorded tokens, then the template's rendering of the new messages),
    `template` renders as the template does and starts a new trajectory
    (`tracerl.gateway.session`)."""

    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Largest accepted request body; larger ones get 413."""

    max_tokens_policy: Literal["cap", "reject"] = "cap"
    """A request whose token budget (`max_tokens`, `max_completion_tokens`,
    `max_output_tokens`) is more than the context has room for after its prompt: `cap` lowers
    it to the room left (recorded as the turn's `max_new_tokens`), `reject` answers 400 naming
    the field. A prompt that leaves no room is a 400 either way."""

    record_routed_experts: bool = True
    """Ask the engine for a mixture-of-experts model's routed experts on every traced turn and
    record them in the trace (`tracerl.routing`); a dense model's engine returns none, so this
    costs it nothing. A run sets it from `trainer.moe.routing` (off for `recompute`)."""

    access_log: bool = True
    """One line per request on stdout: method, path, session, status, tokens, milliseconds
    (`--quiet` turns it off)."""


class GatewayCommandConfig(Config):
    """`tracerl gateway`: the gateway in front of engines, through the engine pool (health
    checks, fail-over with resume, restarts)."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """Which backend the engines are (`backend`), and what launched ones serve; the model is
    always `gateway.model`."""
    pool: PoolConfig = Field(default_factory=PoolConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    """OpenTelemetry spans of requests and generations (off unless `otlp_endpoint` is set)."""


class ServeConfig(Config):
    """`tracerl serve`: an engine (embedded, or a server of `engine.backend`) and the gateway in
    one command."""

    engine: EngineConfig = Field(default_factory=EngineConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    """Used when `engine.backend` is a server: the pool in front of it."""
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    """OpenTelemetry spans of requests and generations (off unless `otlp_endpoint` is set)."""
