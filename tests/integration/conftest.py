"""Gateway fixtures: a gateway on 127.0.0.1 (free port) over any engine, and a fake engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.fakes import FakeEngine
from tracerl.engine.client import EngineClient
from tracerl.engine.server import start_server
from tracerl.gateway.server import Gateway
from tracerl.gateway.store import SQLiteTraceStore, TraceStore


@dataclass
class GatewayHandle:
    url: str
    gateway: Gateway
    store: TraceStore
    runner: Any = None  # its aiohttp runner: `runner.server.connections` are the open ones

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.gateway.admin_key}"}

    async def open_session(self, **body: Any) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.url}/sessions", headers=self.admin, json=body) as r,
        ):
            assert r.status == 200, await r.text()
            return dict(await r.json())

    async def trace(self, session_id: str) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{self.url}/sessions/{session_id}", headers=self.admin) as r,
        ):
            assert r.status == 200, await r.text()
            return dict(await r.json())


@pytest.fixture
async def make_gateway(tiny, tmp_path) -> AsyncIterator[Callable[..., Any]]:
    _, tokenizer = tiny
    started: list[tuple[Any, TraceStore]] = []

    async def build(
        engine: Any, store: TraceStore | None = None, tokenizer: Any = tokenizer, **options: Any
    ) -> GatewayHandle:
        """`tokenizer`: another chat template's (default: the `tiny` model's)."""
        store = store or SQLiteTraceStore(tmp_path / f"traces-{len(started)}.sqlite")
        info = await engine.model_info()
        gateway = Gateway(
            engine,
            tokenizer,
            store,
            model_name="tiny",
            eos_ids=set(info["eos_token_ids"]),
            **options,
        )
        runner, port = await start_server(gateway.app(), "127.0.0.1", 0, cancel_on_disconnect=False)
        started.append((runner, store))
        return GatewayHandle(f"http://127.0.0.1:{port}", gateway, store, runner)

    yield build
    for runner, store in started:
        await runner.cleanup()
        await store.close()


@pytest.fixture
async def fake_engine(tiny) -> AsyncIterator[tuple[FakeEngine, EngineClient]]:
    _, tokenizer = tiny
    fake = FakeEngine(tokenizer, eos_id=tokenizer.eos_token_id)
    runner, port = await start_server(fake.app(), "127.0.0.1", 0)
    client = EngineClient(f"http://127.0.0.1:{port}", timeout_s=30)
    yield fake, client
    await client.close()
    await runner.cleanup()
