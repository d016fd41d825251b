"""The `Engine` protocol: what the gateway and the engine pool need from any inference engine.

The embedded `LocalEngine`, the HTTP `EngineClient` (for engines in other processes, including
SGLang servers) and the simulated engine all implement it, so callers never care where tokens come
from. The HTTP server exposes any `Engine` on the wire protocol of ARCHITECTURE.md.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Literal, Protocol, runtime_checkable

from tracerl.engine.types import GenerateOutput, GenerateRequest

PauseMode = Literal["in_place", "retract", "abort"]
PAUSE_MODES: tuple[PauseMode, ...] = ("in_place", "retract", "abort")


async def collect(chunks: AsyncIterator[GenerateOutput]) -> GenerateOutput:
    """A whole generation from its stream: the last chunk with every chunk's ids and logprobs."""
    ids: list[int] = []
    logprobs: list[float] = []
    last: GenerateOutput | None = None
    async for chunk in chunks:
        ids += chunk.output_ids
        logprobs += chunk.output_logprobs
        last = chunk
    if last is None or last.finish_reason is None:
        raise RuntimeError("generation stream ended without a finish reason")
    last.output_ids, last.output_logprobs = ids, logprobs
    return last


@runtime_checkable
class Engine(Protocol):
    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        """Run one request to completion (stop, length or abort)."""
        ...

    def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        """Yield chunks of new tokens; the last chunk carries the finish reason."""
        ...

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort one request or all; aborted requests finish with their partial output."""
        ...

    async def pause(self, mode: PauseMode = "in_place") -> None: ...

    async def resume(self) -> None: ...

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None: ...

    async def health(self) -> bool: ...

    async def health_generate(self) -> bool: ...

    async def model_info(self) -> dict[str, Any]: ...

    async def metrics_text(self) -> str:
        """Prometheus text with vLLM's metric names."""
        ...

    async def close(self) -> None:
        """Release what the engine holds (its scheduler, or a client's connections)."""
        ...
