import asyncio
import sqlite3

import pytest

from tests.unit.trace.test_trajectories import turn
from tracerl.gateway.store import SQLiteTraceStore, StoreError


async def test_sessions_and_turns_persist_across_reopen(tmp_path) -> None:
    path = tmp_path / "t.sqlite"
    store = SQLiteTraceStore(path)
    await store.create_session("s1", "hash", {"system_prompt": None})
    await store.append_turn("s1", turn(0, [1, 2], [3]))
    await store.append_turn("s1", turn(1, [1, 2, 3, 4], [5], parent=0))
    await store.close()
    reopened = SQLiteTraceStore(path)
    trace = await reopened.trace("s1")
    assert trace is not None and [t.index for t in trace.turns] == [0, 1]
    assert trace.trajectories[0].token_ids == [1, 2, 3, 4, 5]
    assert await reopened.close_session("s1")
    assert (await reopened.get_session("s1")).status == "closed"
    assert await reopened.trace("missing") is None
    await reopened.close()


async def test_a_duplicate_turn_index_is_refused(tmp_path) -> None:
    store = SQLiteTraceStore(tmp_path / "t.sqlite")
    await store.create_session("s", "h", {})
    await store.append_turn("s", turn(0, [1], [2]))
    with pytest.raises(StoreError):
        await store.append_turn("s", turn(0, [1], [2]))
    assert len(await store.turns("s")) == 1
    await store.close()


async def test_concurrent_sessions_all_commit(tmp_path) -> None:
    store = SQLiteTraceStore(tmp_path / "t.sqlite")

    async def session(k: int) -> None:
        await store.create_session(f"s{k}", "h", {})
        for i in range(10):
            await store.append_turn(f"s{k}", turn(i, [k, i], [i + 1]))

    await asyncio.gather(*(session(k) for k in range(20)))
    counts = [len(await store.turns(f"s{k}")) for k in range(20)]
    assert counts == [10] * 20
    await store.close()


async def test_other_processes_can_read_while_writing(tmp_path) -> None:
    store = SQLiteTraceStore(tmp_path / "t.sqlite")
    await store.create_session("s", "h", {})
    await store.append_turn("s", turn(0, [1], [2]))
    reader = sqlite3.connect(tmp_path / "t.sqlite")
    assert reader.execute("SELECT count(*) FROM turns").fetchone() == (1,)
    reader.close()
    await store.close()


async def test_open_store_picks_sqlite_for_a_path_and_redacts_server_passwords(tmp_path) -> None:
    from tracerl.gateway.store import open_store
    from tracerl.gateway.store_postgres import _redacted

    store = await open_store(tmp_path / "t.sqlite")
    assert isinstance(store, SQLiteTraceStore)
    await store.close()
    assert _redacted("postgresql://me:pw@db:5432/traces") == "postgresql://me@db:5432/traces"
    assert _redacted("postgresql://db/traces") == "postgresql://db/traces"
