"""The PostgreSQL trace store against a real server: the store protocol as the SQLite store
keeps it, many writers at once, and a committed turn surviving a gateway's `kill -9`."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from tests.integration.test_gateway_process import ADMIN, start_gateway
from tests.unit.trace.test_trajectories import turn
from tracerl.gateway.store import StoreError, open_store
from tracerl.gateway.store_postgres import PostgresTraceStore

pytestmark = pytest.mark.postgres


async def test_sessions_and_turns_round_trip_and_duplicates_are_refused(fresh_url: str) -> None:
    store = await open_store(fresh_url)
    assert isinstance(store, PostgresTraceStore)
    await store.create_session("s1", "hash", {"system_prompt": None})
    await store.append_turn("s1", turn(0, [1, 2], [3]))
    await store.append_turn("s1", turn(1, [1, 2, 3, 4], [5], parent=0))
    with pytest.raises(StoreError, match="duplicate key"):
        await store.append_turn("s1", turn(1, [1, 2, 3, 4], [5], parent=0))
    await store.close()
    reopened = await open_store(fresh_url)
    trace = await reopened.trace("s1")
    assert trace is not None and [t.index for t in trace.turns] == [0, 1]
    assert trace.trajectories[0].token_ids == [1, 2, 3, 4, 5]
    assert await reopened.close_session("s1")
    record = await reopened.get_session("s1")
    assert record is not None and record.status == "closed" and record.key_hash == "hash"
    assert await reopened.trace("missing") is None
    await reopened.close()


async def test_four_writers_commit_every_turn_once(fresh_url: str) -> None:
    # opened together on an empty database: their schema creation once raced
    stores = list(await asyncio.gather(*(open_store(fresh_url) for _ in range(4))))

    async def writer(w: int) -> None:
        for k in range(10):
            sid = f"w{w}-s{k}"
            await stores[w].create_session(sid, "h", {})
            for i in range(5):
                await stores[w].append_turn(sid, turn(i, [w, k, i], [i + 1]))

    await asyncio.gather(*(writer(w) for w in range(4)))
    reader = stores[0]
    counts = [len(await reader.turns(f"w{w}-s{k}")) for w in range(4) for k in range(10)]
    assert counts == [5] * 40
    for store in stores:
        await store.close()


async def test_an_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(StoreError, match=r"trace store postgresql://u@127.0.0.1:1/x: cannot"):
        await PostgresTraceStore.connect("postgresql://u:secret@127.0.0.1:1/x")


async def test_committed_turns_survive_a_gateways_kill_9(fake_engine, fresh_url: str) -> None:
    fake, engine = fake_engine
    proc, url = await start_gateway(engine.base_url, fresh_url)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{url}/sessions", headers={"Authorization": f"Bearer {ADMIN}"}
            ) as r:
                session = await r.json()
            key = {"Authorization": f"Bearer {session['api_key']}"}
            messages = [{"role": "user", "content": "start"}]
            for k in range(3):
                fake.say(f"answer {k}")
                body = {"model": "tiny", "messages": messages}
                async with http.post(
                    f"{url}/s/{session['session_id']}/v1/chat/completions", json=body, headers=key
                ) as r:
                    assert r.status == 200
                    answer = (await r.json())["choices"][0]["message"]["content"]
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "go"},
                ]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    store = await open_store(fresh_url)
    trace = await store.trace(session["session_id"])
    assert trace is not None and len(trace.turns) == 3
    assert len(trace.trajectories) == 1  # the conversation, one trajectory, as with SQLite
    await store.close()
