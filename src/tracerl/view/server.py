"""The viewer's HTTP server (aiohttp): GET routes only, over one run directory.

Owns routing, the admin-key check, and running reads off the event loop; pages come from
`tracerl.view.pages`, data from `tracerl.view.reader`. Every request first picks up what the
run appended (`RunReader.refresh`), so an open page that polls sees new steps, episodes and
turns; nothing here writes to the run directory.

Routes: `/` (run page), `/episodes` (+ `/episodes/rows`, its live part), `/groups/{group}`,
`/sessions/{id}` (+ `/sessions/{id}/live`), `/api/metrics`, `/api/sessions/{id}` (the trace
JSON: the export, and the admin endpoint for scripts), `/static/...`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from tracerl.config.view import ViewConfig
from tracerl.view import pages
from tracerl.view.advantages import group_advantages_of
from tracerl.view.reader import RunReader, RunUnreadable, parse_filter
from tracerl.view.tokens import TokenText, token_view

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
KEY_COOKIE = "tracerl_view_key"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Viewer:
    """The web application over one run directory."""

    def __init__(self, config: ViewConfig) -> None:
        self.config = config
        self.reader = RunReader(Path(config.run_dir))
        self.tokens: TokenText | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth, self._errors])
        r = app.router
        r.add_get("/", self.run_page)
        r.add_get("/episodes", self.episodes)
        r.add_get("/episodes/rows", self.episode_rows)
        r.add_get("/groups/{group}", self.group)
        r.add_get("/sessions/{sid}", self.session)
        r.add_get("/sessions/{sid}/live", self.session_live)
        r.add_get("/api/metrics", self.metrics)
        r.add_get("/api/sessions/{sid}", self.export)
        r.add_static("/static", STATIC)
        r.add_get("/favicon.ico", self.no_icon)  # browsers ask; a 404 is a console error
        return app

    # ---------------------------------------------------------------------- middleware

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.config.admin_key
        if key is None:
            return await handler(request)
        given = request.query.get("key")
        if given is not None and hmac.compare_digest(given, key):
            # once in the browser's address bar, then a cookie (and the key leaves the URL)
            target = request.rel_url.without_query_params("key")
            response = web.HTTPFound(str(target))
            response.set_cookie(KEY_COOKIE, key, httponly=True, samesite="Strict")
            raise response
        auth = request.headers.get("Authorization", "")
        offered = (
            auth[7:] if auth.startswith("Bearer ") else request.headers.get("x-api-key")
        ) or request.cookies.get(KEY_COOKIE, "")
        if not hmac.compare_digest(offered, key):
            raise web.HTTPUnauthorized(text="tracerl view: admin key required\n")
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A run that cannot be read now (missing, or a store being created) is a page that
        says so, never a stack trace."""
        try:
            return await handler(request)
        except RunUnreadable as e:
            if request.path.startswith("/api/"):
                return web.json_response({"error": str(e)}, status=503)
            return self._html(pages.message_page("cannot show this now", str(e), self._refresh))

    # ---------------------------------------------------------------------- helpers

    @property
    def _refresh(self) -> float:
        return self.config.refresh_s

    def _html(self, text: str, status: int = 200) -> web.Response:
        return web.Response(text=text, status=status, content_type="text/html")

    def _fresh(self) -> str | None:
        """Pick up the run's new lines; why there is nothing to show, or None. On the event
        loop, so no request sees the index half-appended: it reads only what was appended
        (a 100k-line `episodes.jsonl` is read, not parsed, at the first request)."""
        self.reader.refresh()
        return self.reader.missing()

    def _curl(self, request: web.Request, sid: str) -> str:
        header = " -H 'Authorization: Bearer $TRACERL_VIEW_KEY'" if self.config.admin_key else ""
        return f"curl -s{header} {request.url.origin()}/api/sessions/{sid}"

    # ---------------------------------------------------------------------- pages

    async def run_page(self, request: web.Request) -> web.Response:
        missing = self._fresh()
        if missing:
            return self._html(pages.message_page("no run", missing, self._refresh))
        notes = self.reader.metrics.problems()
        name = self.reader.run_dir.resolve().name
        return self._html(pages.run_page(name, self.reader.config(), self._refresh, notes))

    async def _episode_table(self, request: web.Request) -> tuple[str, list[str]]:
        """The live part of the episode list for this request's filters and page; notes."""
        query = {k: v for k, v in request.query.items() if k != "page" and v}
        wanted, notes = parse_filter(query)
        try:
            page = max(0, int(request.query.get("page", "0")))
        except ValueError:
            page, notes = 0, [*notes, "page: not a number; showing the first"]
        size = self.config.page_size
        index = self.reader.episodes
        if index.present:
            total, rows = index.query(wanted, page, size)
        else:  # a capture without the loop's episode lines: the store's sessions
            notes.append("no episodes.jsonl (not written by `tracerl train`): sessions only")
            total, found = await asyncio.to_thread(self.reader.store.recent_sessions, page, size)
            rows = [{"session_id": s.session_id} for s in found]
        ids = [str(r["session_id"]) for r in rows]
        summaries = await asyncio.to_thread(self.reader.store.summaries, ids)
        reasons = {str(r["session_id"]): index.reason(r) for r in rows}
        cells = pages.episode_rows(rows, summaries, reasons)
        return pages.episode_table(total, page, size, query, cells), notes

    async def episodes(self, request: web.Request) -> web.Response:
        missing = self._fresh()
        if missing:
            return self._html(pages.message_page("episodes", missing, self._refresh))
        table, notes = await self._episode_table(request)
        query = {k: v for k, v in request.query.items() if k != "page" and v}
        wanted, _ = parse_filter(query)
        page_query = {**query, "page": request.query.get("page", "0")}
        return self._html(
            pages.episodes_page(
                wanted, self.reader.episodes.choices(), table, page_query, self._refresh, notes
            )
        )

    async def episode_rows(self, request: web.Request) -> web.Response:
        missing = self._fresh()
        if missing:
            raise RunUnreadable(missing)
        table, _ = await self._episode_table(request)
        return self._html(table)

    async def group(self, request: web.Request) -> web.Response:
        missing = self._fresh()
        if missing:
            return self._html(pages.message_page("group", missing, self._refresh))
        try:
            group = int(request.match_info["group"])
        except ValueError:
            raise web.HTTPNotFound(text="a group is a number\n") from None
        members = sorted(self.reader.episodes.group(group), key=lambda r: str(r.get("episode")))
        traces = {}
        for row in members:
            sid = str(row["session_id"])
            traces[sid] = await asyncio.to_thread(self.reader.store.trace, sid)
        advantages, note = await asyncio.to_thread(
            group_advantages_of, members, self.reader.config()
        )
        outcome = self.reader.episodes.outcomes.get(group)
        page = pages.group_page(group, members, advantages, note, traces, outcome, self._refresh)
        return self._html(page)

    async def _session_parts(self, sid: str) -> tuple[Any, str]:
        trace = await asyncio.to_thread(self.reader.store.trace, sid)
        if trace is None:
            raise RunUnreadable(f"session {sid}: not in {self.reader.store.path.name}")
        if self.tokens is None:
            self.tokens = TokenText(self.reader.model_name())
        view = await asyncio.to_thread(token_view, trace, self.tokens)
        return trace, pages.session_body(trace, view, self.tokens.problem)

    async def session(self, request: web.Request) -> web.Response:
        missing = self._fresh()
        if missing:
            return self._html(pages.message_page("session", missing, self._refresh))
        sid = request.match_info["sid"]
        trace, body = await self._session_parts(sid)
        episode = self.reader.episodes.session(sid)
        reason = self.reader.episodes.reason(episode or {"session_id": sid})
        return self._html(
            pages.session_page(
                trace, episode, reason, body, self._curl(request, sid), self._refresh
            )
        )

    async def session_live(self, request: web.Request) -> web.Response:
        missing = self._fresh()
        if missing:
            raise RunUnreadable(missing)
        _, body = await self._session_parts(request.match_info["sid"])
        return self._html(body)

    async def no_icon(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    # ---------------------------------------------------------------------- JSON

    async def metrics(self, request: web.Request) -> web.Response:
        missing = self._fresh()
        if missing:
            raise RunUnreadable(missing)
        series = self.reader.metrics
        return web.json_response({"records": series.records, "problems": series.problems()})

    async def export(self, request: web.Request) -> web.Response:
        missing = self._fresh()
        if missing:
            raise RunUnreadable(missing)
        sid = request.match_info["sid"]
        trace = await asyncio.to_thread(self.reader.store.trace, sid)
        if trace is None:
            return web.json_response({"error": f"session {sid} not found"}, status=404)
        response = web.Response(text=trace.model_dump_json(), content_type="application/json")
        if "download" in request.query:
            response.headers["Content-Disposition"] = f'attachment; filename="{sid}.json"'
        return response


async def start(config: ViewConfig) -> tuple[web.AppRunner, str]:
    """The viewer listening on `config.host`:`config.port`; its runner and URL."""
    runner = web.AppRunner(Viewer(config).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    return runner, f"http://{config.host}:{int(runner.addresses[0][1])}/"
