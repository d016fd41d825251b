"""A key in front of an engine server: an HTTP proxy on the interface other machines reach
that forwards every request, streamed both ways, to the server on 127.0.0.1, and answers 401
to any request without `Authorization: Bearer KEY`.

Engine actors put one in front of their server when `cluster.bind` is not loopback, so every
engine requires the key whatever its backend: vLLM's own `--api-key` guards only its `/v1`
routes, not the generate, abort, pause and weight routes the pool uses. The key is compared in
constant time and never logged.
"""

from __future__ import annotations

import hmac

import aiohttp
from aiohttp import web

from tracerl.engine.client import IDLE_CONNECTION_S

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}
)


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
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() != "authorization"
        }
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.raw_path_qs,
            headers=headers,
            data=await request.read() if request.can_read_body else None,
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={
                    k: v
                    for k, v in upstream.headers.items()
                    if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"
                },
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
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
