"""A real PostgreSQL server (Debian's `postgresql` package) for the tests: a fresh cluster in a
temporary directory, listening on 127.0.0.1 on a free port, stopped at the end. Skipped where
the server binaries or psycopg (the `[postgres]` extra) are missing: `make test-postgres`
installs both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import fake_engine  # noqa: F401 (a fixture these tests use)
from tracerl.bench.postgres_server import server_binaries, temporary_server

pytest.importorskip("psycopg_pool", reason="psycopg is not installed (make test-postgres)")
if server_binaries() is None:
    pytest.skip(
        "no PostgreSQL server binaries (make test-postgres installs them)", allow_module_level=True
    )


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with temporary_server() as url:
        yield url


@pytest.fixture
async def fresh_url(postgres_url: str) -> str:
    """The server with empty tables (each test starts from none)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS turns; DROP TABLE IF EXISTS sessions")
    return postgres_url
