"""The trace store on a PostgreSQL server: the `TraceStore` protocol for many writers (several
gateways on several machines) and one reader (the trainer), the same sessions and turns as the
SQLite store.

Durability is the SQLite store's promise: `append_turn` returns after its transaction has
committed on the server (`synchronous_commit` on, the server's default), so a committed turn
survives a `kill -9` of the gateway that wrote it. Connections come from a small pool (psycopg 3,
the `[postgres]` extra); each call is one transaction. A turn is unique by (session, index): a
second writer of the same turn gets a `StoreError`, never a silent duplicate.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tracerl.gateway.store import SessionRecord, StoreError, read_trace, turn_json
from tracerl.trace.schema import SessionTrace, Turn

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'closed')),
    created DOUBLE PRECISION NOT NULL,
    meta TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS turns (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    idx INTEGER NOT NULL,
    data TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (session_id, idx)
);
"""
EXTRA = "pip install 'tracerl[postgres]'"
SCHEMA_LOCK = 0x7472616365726C  # "tracerl": the advisory lock id of schema creation
POOL_SIZE = 8  # concurrent transactions per store: a gateway's requests commit in parallel


class PostgresTraceStore:
    """Open with `await PostgresTraceStore.connect(url)`; `url` is a libpq connection string
    (`postgresql://user@127.0.0.1:5432/traces`)."""

    def __init__(self, pool: Any, url: str) -> None:
        self._pool = pool
        self.url = url
        self.path = _redacted(url)  # what errors name (never the password)

    @classmethod
    async def connect(cls, url: str, pool_size: int = POOL_SIZE) -> PostgresTraceStore:
        try:
            from psycopg_pool import AsyncConnectionPool
        except ImportError:
            raise StoreError(f"a postgresql:// trace store needs psycopg: {EXTRA}") from None
        pool = AsyncConnectionPool(url, min_size=1, max_size=pool_size, open=False)
        try:
            await pool.open(wait=True, timeout=30)
            async with pool.connection() as conn:
                # CREATE TABLE IF NOT EXISTS races when gateways start together (a duplicate
                # pg_type row): one creator at a time, the lock released with the transaction
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                await conn.execute(SCHEMA)
        except Exception as e:
            await pool.close()
            raise StoreError(f"trace store {_redacted(url)}: cannot connect ({e})") from None
        return cls(pool, url)

    async def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        import psycopg

        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(sql, params)
                return int(cursor.rowcount)
        except psycopg.Error as e:
            raise StoreError(f"trace store {self.path}: {e}") from e

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(sql, params)
                return list(await cursor.fetchall())
        except psycopg.Error as e:
            raise StoreError(f"trace store {self.path}: {e}") from e

    async def create_session(self, session_id: str, key_hash: str, meta: dict[str, Any]) -> None:
        await self._execute(
            "INSERT INTO sessions (id, key_hash, status, created, meta) VALUES (%s,%s,%s,%s,%s)",
            (session_id, key_hash, "open", time.time(), json.dumps(meta)),
        )

    async def get_session(self, session_id: str) -> SessionRecord | None:
        rows = await self._fetch(
            "SELECT key_hash, status, meta FROM sessions WHERE id = %s", (session_id,)
        )
        if not rows:
            return None
        key_hash, status, meta = rows[0]
        return SessionRecord(session_id, key_hash, status, json.loads(meta))

    async def close_session(self, session_id: str) -> bool:
        sql = "UPDATE sessions SET status = 'closed' WHERE id = %s"
        return await self._execute(sql, (session_id,)) == 1

    async def append_turn(self, session_id: str, turn: Turn) -> None:
        await self._execute(
            "INSERT INTO turns (session_id, idx, data, created) VALUES (%s,%s,%s,%s)",
            (session_id, turn.index, turn_json(turn), time.time()),
        )

    async def turns(self, session_id: str) -> list[Turn]:
        rows = await self._fetch(
            "SELECT data FROM turns WHERE session_id = %s ORDER BY idx", (session_id,)
        )
        return [Turn.model_validate_json(r[0]) for r in rows]

    async def trace(self, session_id: str) -> SessionTrace | None:
        return await read_trace(self, session_id)

    async def close(self) -> None:
        await self._pool.close()


def _redacted(url: str) -> str:
    """`url` without its password."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"
