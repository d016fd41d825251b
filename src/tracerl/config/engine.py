"""Configuration of the embedded inference engine and of the HTTP servers that expose it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tracerl.config.base import Config


class EngineConfig(Config):
    model: str = "tiny"
    """A local Hugging Face directory, or a built-in name: `smollm2-135m`, `tiny`."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; `auto` picks CUDA when present."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and KV cache dtype; `auto` is float32 on CPU (CPU half precision is slow and
    inexact) and bfloat16 on CUDA."""

    max_model_len: int | None = Field(default=None, ge=2)
    """Longest prompt + completion in tokens; unset uses the model's `max_position_embeddings`."""

    kv_cache_tokens: int = Field(default=65536, ge=16)
    """KV cache budget in tokens over all running requests; requests beyond it wait in a queue,
    and running requests that outgrow it are preempted (recomputed later)."""

    max_running_requests: int = Field(default=64, ge=1, le=4096)
    """Most requests decoded together in one batch."""

    default_max_new_tokens: int = Field(default=1024, ge=1)
    """Completion budget for requests that give no `max_new_tokens` (capped by the context)."""

    seed: int = 0
    """Seed of the engine's own random stream, used for requests without a `seed`."""


class ServerConfig(Config):
    host: str = "127.0.0.1"
    """Interface to bind; loopback by default so nothing is exposed by accident."""

    port: int = Field(default=30000, ge=0, le=65535)
    """TCP port; 0 picks a free one (printed at start)."""

    max_request_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Largest accepted request body."""


class EngineCommandConfig(Config):
    """`tracerl engine`: one engine behind the engine wire protocol."""

    engine: EngineConfig = Field(default_factory=EngineConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
