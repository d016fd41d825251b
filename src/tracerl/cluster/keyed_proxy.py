"""A key in front of an engine server: an HTTP proxy on the interface other machines reach
that forwards every request, streamed both ways, to the server on 127.0.0.1, and answers 401
to any request without `Authorization: Bearer KEY`.

Engine actors put one in front of their server on `cluster.bind` when `engine.api_key` is
set (a bind beyond loopback requires the key), so every engine requires it whatever its
backend: vLLM's own `--api-key` guards only its `/v1` routes, not the generate, abort, pause
and weight routes the pool uses. The key is compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from tracerl.engine.client import IDLE_CONNECTION_S
from tracerl.engine.server import start_server

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}
)


def _passed(headers: Mapping[str, str], dropped: str) -> dict[str, str]:
    """`headers` less the hop-by-hop ones and `dropped`."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP | {dropped}}


class KeyedProxy:
    """Forwards to `upstream` (`http://127.0.0.1:PORT`) what carries the key."""

    def __init__(self, upstream: str, api_key: str) -> None:
        self.upstream = upstream.rstrip("/")
        self._expected = f"Bearer {api_key}".encode()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    def _authorized(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "").encode()
        return hmac.compare_digest(given, self._expected)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return web.json_response(
                {"error": {"message": "this engine requires its key (engine.api_key)"}}, status=401
            )
        assert self._session is not None
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.raw_path_qs,
            headers=_passed(request.headers, "authorization"),  # the key stops here
            data=await request.read() if request.can_read_body else None,
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers=_passed(upstream.headers, "content-length"),  # streamed, not sized
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def start(self, host: str, port: int = 0) -> int:
        """Serve on `host:port` (0: a free port); returns the port."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=IDLE_CONNECTION_S),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner, bound = await start_server(app, host, port, cancel_on_disconnect=False)
        return bound

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
