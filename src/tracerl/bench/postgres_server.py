"""A throwaway PostgreSQL server (Debian's `postgresql` package): a fresh cluster in a
temporary directory on 127.0.0.1 and a free port, for `tracerl bench store` and the tests."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tracerl.rollout.backends import free_port


def server_binaries() -> Path | None:
    """The newest installed server's `bin` directory, if any."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return Path(found[-1]) if found else None


def _as_postgres(argv: list[str]) -> list[str]:
    """The server refuses to run as root: run it as the package's `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def temporary_server() -> Iterator[str]:
    """A running server for the block; yields its URL (user `tracerl`, database `postgres`)."""
    bin_dir = server_binaries()
    if bin_dir is None:
        raise FileNotFoundError("no PostgreSQL server: apt-get install postgresql")
    # a directory the postgres user can enter (pytest's and many temp dirs are root's only)
    root = Path(tempfile.mkdtemp(prefix="tracerl-postgres-"))
    data = root / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(data, "postgres")
    port = free_port()
    init = [str(bin_dir / "initdb"), "-D", str(data), "-U", "tracerl", "--auth=trust"]
    ctl = [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log")]
    try:
        subprocess.run(_as_postgres(init), check=True, capture_output=True, timeout=120)
        options = f"-h 127.0.0.1 -p {port} -k {data}"
        subprocess.run(
            _as_postgres([*ctl, "-o", options, "-w", "-t", "120", "start"]),
            check=True, capture_output=True, timeout=180,
        )  # fmt: skip
        try:
            yield f"postgresql://tracerl@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(
                _as_postgres([*ctl, "-m", "fast", "-w", "stop"]), capture_output=True, timeout=120
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
