"""Routing over several engines: a session's requests stay on one engine (prefix-cache locality).

This is the pool's routing core only: it implements the `Engine` protocol over N engines, sending
each request to the engine its affinity key hashes to. Health checks, retries on another engine,
abort/resume and weight-sync fan-out are the engine pool's next layer.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator
from typing import Any

from tracerl.engine.protocol import Engine, PauseMode
from tracerl.engine.types import GenerateOutput, GenerateRequest


def affinity_key(rid: str) -> str:
    """Gateway request ids are `SESSION-REQUEST`; the session part is the affinity key."""
    return rid.split("-", 1)[0]


class EnginePool:
    def __init__(self, engines: list[Engine]) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.engines = engines
        self._owner: dict[str, Engine] = {}

    def route(self, rid: str) -> Engine:
        digest = hashlib.sha256(affinity_key(rid).encode()).digest()
        return self.engines[int.from_bytes(digest[:8], "big") % len(self.engines)]

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        return await self.route(request.rid).generate(request)

    async def generate_stream(
        self, request: GenerateRequest
    ) -> AsyncGenerator[GenerateOutput, None]:
        engine = self.route(request.rid)
        self._owner[request.rid] = engine
        try:
            async for chunk in engine.generate_stream(request):
                yield chunk
        finally:
            self._owner.pop(request.rid, None)

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        if abort_all:
            counts = await asyncio.gather(*(e.abort(abort_all=True) for e in self.engines))
            return sum(counts)
        engine = self._owner.get(rid or "")
        return await engine.abort(rid) if engine is not None else 0

    async def pause(self, mode: PauseMode = "in_place") -> None:
        await asyncio.gather(*(e.pause(mode) for e in self.engines))

    async def resume(self) -> None:
        await asyncio.gather(*(e.resume() for e in self.engines))

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        await asyncio.gather(
            *(e.update_weights_from_disk(model_path, weight_version) for e in self.engines)
        )

    async def health(self) -> bool:
        return all(await asyncio.gather(*(e.health() for e in self.engines)))

    async def health_generate(self) -> bool:
        return all(await asyncio.gather(*(e.health_generate() for e in self.engines)))

    async def model_info(self) -> dict[str, Any]:
        return await self.engines[0].model_info()

    async def metrics_text(self) -> str:
        return "".join(await asyncio.gather(*(e.metrics_text() for e in self.engines)))
