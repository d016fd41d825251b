"""The durable trace store: sessions and their turns in SQLite (WAL).

`append_turn` returns only after the turn's transaction has committed, so a gateway that answers
success after it has recorded a turn that survives a `kill -9` of the process. (With the default
`synchronous=NORMAL`, an operating-system crash or power loss may lose the last commits; choose
`"full"` to fsync every commit.) All SQLite work runs on one dedicated thread: the event loop never
blocks on disk, and writes are serialised without lock contention. Other processes (the trainer)
can read the same file concurrently.
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

from tracerl.gateway.schema import SessionTrace, Turn
from tracerl.gateway.trajectories import assemble_trajectories

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


class SQLiteTraceStore:
    def __init__(self, path: str | Path, synchronous: Literal["normal", "full"] = "normal") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-store")
        self._conn: sqlite3.Connection | None = None
        self._synchronous = synchronous
        self._run_sync(self._open)

    def _open(self) -> None:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(SCHEMA)
        self._conn = conn

    def _run_sync(self, fn: Callable[[], T]) -> T:
        return self._executor.submit(fn).result()

    async def _run(self, fn: Callable[[], T]) -> T:
        if self._conn is None and fn is not self._open:
            raise StoreError(f"trace store {self.path} is closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except sqlite3.Error as e:
            raise StoreError(f"trace store {self.path}: {e}") from e

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"trace store {self.path} is closed")
        return self._conn

    async def create_session(self, session_id: str, key_hash: str, meta: dict[str, Any]) -> None:
        def write() -> None:
            self._db().execute(
                "INSERT INTO sessions (id, key_hash, status, created, meta) VALUES (?,?,?,?,?)",
                (session_id, key_hash, "open", time.time(), json.dumps(meta)),
            )

        await self._run(write)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        def read() -> SessionRecord | None:
            row = (
                self._db()
                .execute("SELECT key_hash, status, meta FROM sessions WHERE id = ?", (session_id,))
                .fetchone()
            )
            if row is None:
                return None
            return SessionRecord(session_id, row[0], row[1], json.loads(row[2]))

        return await self._run(read)

    async def close_session(self, session_id: str) -> bool:
        def write() -> bool:
            cur = self._db().execute(
                "UPDATE sessions SET status = 'closed' WHERE id = ?", (session_id,)
            )
            return cur.rowcount == 1

        return await self._run(write)

    async def append_turn(self, session_id: str, turn: Turn) -> None:
        data = turn.model_dump_json()

        def write() -> None:
            self._db().execute(
                "INSERT INTO turns (session_id, idx, data, created) VALUES (?,?,?,?)",
                (session_id, turn.index, data, time.time()),
            )

        await self._run(write)

    async def turns(self, session_id: str) -> list[Turn]:
        def read() -> list[str]:
            rows = self._db().execute(
                "SELECT data FROM turns WHERE session_id = ? ORDER BY idx", (session_id,)
            )
            return [r[0] for r in rows]

        return [Turn.model_validate_json(d) for d in await self._run(read)]

    async def trace(self, session_id: str) -> SessionTrace | None:
        record = await self.get_session(session_id)
        if record is None:
            return None
        turns = await self.turns(session_id)
        return SessionTrace(
            session_id=session_id,
            status=record.status,
            turns=turns,
            trajectories=assemble_trajectories(turns),
        )

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=True)
