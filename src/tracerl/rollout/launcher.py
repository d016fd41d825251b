"""Engines tracerl starts itself: a process it can start, stop and restart.

`ProcessLauncher` runs any command that serves an engine: either one that prints its
`http://127.0.0.1:PORT` URL when ready (the embedded or simulated `tracerl engine` on port 0),
or, given `url`, one started on a known port and ready when `GET url/health` answers 200 (a
vLLM or SGLang server). Given `ready`, readiness also needs that check to pass (a real
generation: a server that answers `/health` may still fail on its first request), so the pool
treats every kind of launched engine the same way.

The process runs in a session of its own and is stopped as a process group: vLLM and SGLang
fork workers that would outlive their parent. It is also sent SIGTERM if the launching process
dies without stopping it (Linux's parent-death signal). Its output goes to `log_path` when
given (the file named in every start-up error), else is read and discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any, Protocol

import aiohttp

_URL = re.compile(rb"http://127\.0\.0\.1:\d+")

PR_SET_PDEATHSIG = 1  # prctl(2) option: a signal for the child when its parent dies

STOP_GRACE_S = 20.0
"""How long a stopped engine may take to exit after SIGTERM before its group is killed."""

READY_PROBE_S = 60.0
"""How long one readiness probe (a generated token) may take: a server whose engine died
while it served the probe can hold the request open while it shuts down (vLLM waits for its
connections), so an unbounded probe waited out the whole start-up timeout."""


class EngineStartError(RuntimeError):
    """A launched engine exited or never became ready; the message names its log file."""


class EngineLauncher(Protocol):
    async def start(self) -> str:
        """Start the engine; return its base URL once it is ready."""
        ...

    async def stop(self) -> None: ...

    def alive(self) -> bool: ...


class ProcessLauncher:
    def __init__(
        self,
        argv: list[str],
        url: str | None = None,
        ready_timeout_s: float = 180.0,
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        ready: Callable[[str], Awaitable[bool]] | None = None,
        name: str | None = None,
        probe_timeout_s: float = READY_PROBE_S,
    ) -> None:
        self.argv = argv
        self.probe_timeout_s = probe_timeout_s
        self.url = url
        self.ready_timeout_s = ready_timeout_s
        self.env = env
        self.log_path = log_path
        self.ready = ready
        self.name = name or Path(argv[0]).name
        self.process: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        self._log: IO[bytes] | None = None

    async def start(self) -> str:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (open while the process runs)
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **self.env} if self.env else None,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        assert self.process.stdout is not None
        found: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._drain = asyncio.create_task(self._read(self.process.stdout, found))
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                url = await self._until_ready(found)
        except TimeoutError:
            await self.stop()
            raise EngineStartError(
                f"{self.name} did not become ready within {self.ready_timeout_s:.0f} s"
                + self._log_hint()
            ) from None
        except BaseException:
            await self.stop()
            raise
        return url

    async def _until_ready(self, found: asyncio.Future[str]) -> str:
        if self.url is not None:
            url = await self._health_ready(self.url)
        else:
            exited = asyncio.create_task(self._exited())
            waiters: set[asyncio.Future[Any]] = {found, exited}
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                exited.cancel()
            if not found.done():
                raise EngineStartError(self._exit_message())
            url = found.result()
        while self.ready is not None and not await self._probe(url):
            if not self.alive():
                await self._exited()
                raise EngineStartError(self._exit_message())
            await asyncio.sleep(0.5)
        return url

    async def _probe(self, url: str) -> bool:
        assert self.ready is not None
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                return await self.ready(url)
        except TimeoutError:
            return False

    async def _exited(self) -> None:
        assert self.process is not None
        await self.process.wait()
        if self._drain is not None:  # its last words reach the log before the error names it
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({self._drain}, timeout=5)

    def _exit_message(self) -> str:
        code = self.process.returncode if self.process is not None else None
        return f"{self.name} exited (code {code}) before it was ready" + self._log_hint()

    def _log_hint(self) -> str:
        if self.log_path is None:
            return ""
        with contextlib.suppress(OSError):
            tail = self.log_path.read_bytes()[-2000:].decode(errors="replace").strip()
            last = "\n".join(tail.splitlines()[-8:])
            return f"; its log: {self.log_path}" + (f"; last lines:\n{last}" if last else "")
        return f"; its log: {self.log_path}"

    async def _health_ready(self, url: str) -> str:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while True:
                if not self.alive():
                    await self._exited()
                    raise EngineStartError(self._exit_message())
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            return url
                await asyncio.sleep(0.2)

    async def _read(self, stream: asyncio.StreamReader, found: asyncio.Future[str]) -> None:
        """Copy the output to the log (keeping the pipe from filling) and find the URL."""
        while line := await stream.readline():
            if self._log is not None:
                self._log.write(line)
                self._log.flush()
            if not found.done() and (match := _URL.search(line)):
                found.set_result(match.group(0).decode())

    async def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            if proc.returncode is None:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    async with asyncio.timeout(STOP_GRACE_S):
                        await proc.wait()
                except TimeoutError:
                    pass
            _signal_group(proc.pid, signal.SIGKILL)  # workers the leader left behind
            if proc.returncode is None:
                await proc.wait()
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
            self._drain = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launching process dies, however it dies (a
    Ray actor killed, a driver's kill -9), so no server outlives what supervises it. Linux
    only; elsewhere the stop path alone ends the server."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
