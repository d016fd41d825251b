"""Engines tracerl starts itself: a process it can start, stop and restart.

`ProcessLauncher` runs any command that serves the engine wire protocol: either one that prints
its `http://127.0.0.1:PORT` URL when ready (the embedded or simulated `tracerl engine`), or, given
`url`, one started on a known port and ready when `GET url/health` answers 200 (an SGLang server,
or vLLM behind the adapter), so the pool treats every kind of launched engine the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Protocol

import aiohttp

_URL = re.compile(rb"http://127\.0\.0\.1:\d+")


class EngineLauncher(Protocol):
    async def start(self) -> str:
        """Start the engine; return its base URL once it is ready."""
        ...

    async def stop(self) -> None: ...

    def alive(self) -> bool: ...


class ProcessLauncher:
    def __init__(
        self, argv: list[str], url: str | None = None, ready_timeout_s: float = 180.0
    ) -> None:
        self.argv = argv
        self.url = url
        self.ready_timeout_s = ready_timeout_s
        self.process: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None

    async def start(self) -> str:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        assert self.process.stdout is not None
        stdout = self.process.stdout

        async def ready() -> str:
            if self.url is not None:
                return await self._health_ready(self.url)
            while True:
                line = await stdout.readline()
                if not line:
                    raise RuntimeError(f"engine exited before it was ready: {self.argv[:6]}")
                match = _URL.search(line)
                if match:
                    return match.group(0).decode()

        try:
            async with asyncio.timeout(self.ready_timeout_s):
                url = await ready()
        except BaseException:
            await self.stop()
            raise
        self._drain = asyncio.create_task(self._discard(stdout))  # keep the pipe from filling
        return url

    async def _health_ready(self, url: str) -> str:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while True:
                if not self.alive():
                    raise RuntimeError(f"engine exited before it was ready: {self.argv[:6]}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            return url
                await asyncio.sleep(0.2)

    @staticmethod
    async def _discard(stream: asyncio.StreamReader) -> None:
        while await stream.readline():
            pass

    async def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
            self._drain = None

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None
