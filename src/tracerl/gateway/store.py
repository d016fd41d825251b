"""The durable trace store: sessions and their turns in SQLite (WAL), or on a PostgreSQL server
for many writers (`store_postgres.py`, opened by `open_store` from a `postgresql://` URL).

`append_turn` returns only after the turn's transaction has committed, so a gateway that answers
success after it has recorded a turn that survives a `kill -9` of the process. (With the default
`synchronous=NORMAL`, an operating-system crash or power loss may lose the last commits; choose
`"full"` to fsync every commit.) Writes go through one connection and reads through another (WAL
lets them proceed together); reads, and writes that wait for fsync, run on the store's own thread
so the event loop never blocks on disk. Other processes (the trainer) can read the same file
concurrently.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import orjson

from tracerl.trace.schema import SessionTrace, Turn
from tracerl.trace.trajectories import session_trace

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'closed')),
    created REAL NOT NULL,
    meta TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS turns (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    idx INTEGER NOT NULL,
    data TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (session_id, idx)
);
"""


class StoreError(RuntimeError):
    """The store could not record or read something; the caller must not report success."""


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    key_hash: str
    status: Literal["open", "closed"]
    meta: dict[str, Any]


class TraceStore(Protocol):
    async def create_session(
        self, session_id: str, key_hash: str, meta: dict[str, Any]
    ) -> None: ...

    async def get_session(self, session_id: str) -> SessionRecord | None: ...

    async def close_session(self, session_id: str) -> bool: ...

    async def append_turn(self, session_id: str, turn: Turn) -> None: ...

    async def turns(self, session_id: str) -> list[Turn]: ...

    async def trace(self, session_id: str) -> SessionTrace | None: ...

    async def close(self) -> None: ...


def turn_json(turn: Turn) -> str:
    """A turn as the stores keep it: orjson over the field dict (a fifth of `model_dump_json`'s
    cost for the same JSON), nested models (its routed experts) as their dicts."""
    return orjson.dumps(dict(turn), default=lambda v: v.model_dump()).decode()


async def read_trace(store: TraceStore, session_id: str) -> SessionTrace | None:
    """A session's record and turns from `store`, with its trajectories assembled; None for a
    session the store does not hold."""
    record = await store.get_session(session_id)
    if record is None:
        return None
    return session_trace(session_id, record.status, await store.turns(session_id))


class SQLiteTraceStore:
    def __init__(self, path: str | Path, synchronous: Literal["normal", "full"] = "normal") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._synchronous = synchronous
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-store")
        self._writer: sqlite3.Connection | None = self._connect(create=True)
        self._reader: sqlite3.Connection | None = self._connect(create=False)

    def _connect(self, create: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
        conn.execute("PRAGMA busy_timeout=5000")
        if create:
            conn.executescript(SCHEMA)
        return conn

    async def _write(self, sql: str, params: tuple[Any, ...]) -> int:
        """Run one write and commit. Without fsync (`normal`) a WAL append takes well under a
        millisecond, so it runs right here: a thread hop would cost more than the write. With
        `full` every commit waits for the disk, so it runs on the store's thread."""
        if self._writer is None:
            raise StoreError(f"trace store {self.path} is closed")
        writer = self._writer

        def write() -> int:
            return writer.execute(sql, params).rowcount

        try:
            if self._synchronous == "normal":
                return write()
            return await asyncio.get_running_loop().run_in_executor(self._executor, write)
        except sqlite3.Error as e:
            raise StoreError(f"trace store {self.path}: {e}") from e

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._reader is None:
            raise StoreError(f"trace store {self.path} is closed")
        reader = self._reader
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, lambda: fn(reader)
            )
        except sqlite3.Error as e:
            raise StoreError(f"trace store {self.path}: {e}") from e

    async def create_session(self, session_id: str, key_hash: str, meta: dict[str, Any]) -> None:
        await self._write(
            "INSERT INTO sessions (id, key_hash, status, created, meta) VALUES (?,?,?,?,?)",
            (session_id, key_hash, "open", time.time(), json.dumps(meta)),
        )

    async def get_session(self, session_id: str) -> SessionRecord | None:
        def read(db: sqlite3.Connection) -> SessionRecord | None:
            row = db.execute(
                "SELECT key_hash, status, meta FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if row is None:
                return None
            return SessionRecord(session_id, row[0], row[1], json.loads(row[2]))

        return await self._read(read)

    async def close_session(self, session_id: str) -> bool:
        sql = "UPDATE sessions SET status = 'closed' WHERE id = ?"
        return await self._write(sql, (session_id,)) == 1

    async def append_turn(self, session_id: str, turn: Turn) -> None:
        await self._write(
            "INSERT INTO turns (session_id, idx, data, created) VALUES (?,?,?,?)",
            (session_id, turn.index, turn_json(turn), time.time()),
        )

    async def turns(self, session_id: str) -> list[Turn]:
        def read(db: sqlite3.Connection) -> list[str]:
            rows = db.execute(
                "SELECT data FROM turns WHERE session_id = ? ORDER BY idx", (session_id,)
            )
            return [r[0] for r in rows]

        return [Turn.model_validate_json(d) for d in await self._read(read)]

    async def trace(self, session_id: str) -> SessionTrace | None:
        return await read_trace(self, session_id)

    async def close(self) -> None:
        def shut() -> None:
            for conn in (self._writer, self._reader):
                if conn is not None:
                    conn.close()
            self._writer = self._reader = None

        await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=True)


async def open_store(
    where: str | Path, synchronous: Literal["normal", "full"] = "normal"
) -> TraceStore:
    """The store at `where`: a `postgresql://` (or `postgres://`) URL opens a PostgreSQL
    store (`tracerl.gateway.store_postgres`), anything else is a SQLite file."""
    text = str(where)
    if text.startswith(("postgresql://", "postgres://")):
        from tracerl.gateway.store_postgres import PostgresTraceStore

        return await PostgresTraceStore.connect(text)
    return SQLiteTraceStore(where, synchronous)
