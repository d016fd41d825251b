"""The gateway's HTTP surface: sessions, endpoint classification, traced generations, fail closed.

Only `POST …/v1/chat/completions`, `POST …/v1/messages` and `POST …/v1/responses` are
generations, decided by the normalised method and path (never by the body). Everything else never
touches traces: `count_tokens` and `models` are answered here and unknown paths get a native 404.
A Responses API `previous_response_id` is resolved from the session's recorded turns
(`responses_api.chain`).
A traced generation answers success only after its turn is committed to the store; a stream
holds its `[DONE]` / `message_stop` / `response.completed` until then, and ends with an error
event and no end marker when the engine reply cannot be traced or recording fails. A client that
disconnects mid-stream does not stop the generation: it is drained and recorded with
`client_disconnected: true`.

One module of ~560 lines: the HTTP surface (auth, sessions, classification, the traced
generation and its streaming) shares one Gateway's state; the API shapes live in the dialect
modules, the shared replies (errors, access log) in `replies.py`, the prompt planning (forced
calls included), token budget and turn recording in `session.py` and the request spans
(telemetry) in `spans.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from tracerl.engine.protocol import Engine
from tracerl.gateway.anthropic_api import DIALECT as ANTHROPIC
from tracerl.gateway.api import Dialect, Outcome
from tracerl.gateway.demonstrations import DemonstrationEngine, check_read_back, demonstration_of
from tracerl.gateway.generation import (
    Completion,
    EngineUnavailable,
    Progress,
    UntraceableReply,
    UpstreamError,
    generate,
)
from tracerl.gateway.messages import BadRequest, anthropic_messages, anthropic_tools
from tracerl.gateway.openai_api import DIALECT as OPENAI
from tracerl.gateway.render import ChatRenderer
from tracerl.gateway.replies import (
    SESSION_PATH,
    STREAM_ERROR_KEY,
    access_log_middleware,
    classify,
    close_stream,
    error_response,
    normalize_path,
    note_completion,
    orjson_response,
    read_json,
)
from tracerl.gateway.responses_api import DIALECT as RESPONSES
from tracerl.gateway.responses_api import PreviousNotFound, chain, with_references_resolved
from tracerl.gateway.session import (
    PendingTurn,
    SessionState,
    commit_turn,
    constrain,
    fit_budget,
    forced_call_of,
    plan_prompt,
    with_system_prompt,
)
from tracerl.gateway.spans import end_request_span, request_span
from tracerl.gateway.store import StoreError, TraceStore
from tracerl.telemetry import Span, Telemetry, valid_traceparent

log = logging.getLogger(__name__)

GATEWAY_KEY = web.AppKey("gateway", object)
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]+")
BASE_PATHS = frozenset({"/", "/v1", "/api/hello"})
"""Base URLs clients probe (Claude Code's `HEAD /api/hello` pre-connect, a `GET` of the base
URL): 200 for any of them, under a session or not, revealing nothing."""
_ROUTES = {
    ("POST", "/v1/chat/completions"): "chat",
    ("POST", "/v1/messages"): "messages",
    ("POST", "/v1/messages/count_tokens"): "count_tokens",
    ("GET", "/v1/models"): "models",
    ("POST", "/v1/responses"): "responses",
}


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Gateway:
    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        store: TraceStore,
        *,
        model_name: str,
        eos_ids: set[int],
        admin_key: str | None = None,
        system_prompt: str | None = None,
        max_request_bytes: int = 16 * 1024 * 1024,
        max_model_len: int | None = None,
        max_tokens_policy: str = "cap",
        access_log: bool = False,
        telemetry: Telemetry | None = None,
        history: str = "extend",
        chat_format: str = "auto",
        record_routed_experts: bool = True,
    ) -> None:
        """`max_model_len`: the engines' context (the model info's), against which token
        budgets are capped or rejected (`max_tokens_policy`); `access_log`: a line per
        request on stdout; `telemetry`: where request spans go (default: off); `history`:
        `gateway.history` (`tracerl.gateway.session`); `chat_format`: `gateway.chat_format`;
        `record_routed_experts`: `gateway.record_routed_experts`."""
        self.telemetry = telemetry or Telemetry()
        self.engine, self.tokenizer, self.store = engine, tokenizer, store
        self.max_model_len, self.max_tokens_policy = max_model_len, max_tokens_policy
        self.access_log = access_log
        self.renderer = ChatRenderer(tokenizer, chat_format)
        self.stop_ids = self.renderer.stop_ids()  # the engines stop there too
        self.model_name, self.eos_ids = model_name, eos_ids | set(self.stop_ids)
        self.history, self.turn_ends = history, self.renderer.turn_ends(self.eos_ids)
        self.admin_key = admin_key or secrets.token_urlsafe(24)
        self.system_prompt = system_prompt
        self.record_routed_experts = record_routed_experts
        self.max_request_bytes = max_request_bytes
        self.sessions: dict[str, SessionState] = {}
        self.counters: Counter[str] = Counter()
        self._tokenize_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")
        self._busy = 0  # generation requests in progress

    def app(self) -> web.Application:
        middlewares = [access_log_middleware] if self.access_log else []
        app = web.Application(client_max_size=self.max_request_bytes, middlewares=middlewares)
        app[GATEWAY_KEY] = self
        app.router.add_post("/sessions", self.create_session)
        app.router.add_get("/sessions/{sid}", self.get_trace)
        app.router.add_post("/sessions/{sid}/close", self.close_session)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/openapi.json", self.openapi)
        # [\s\S]: any path, newlines included (".*" stops at one: aiohttp's plain 404)
        app.router.add_route("*", r"/{tail:[\s\S]*}", self.dispatch)
        return app

    # ------------------------------------------------------------------ auth and sessions

    @staticmethod
    def _presented_key(request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.headers.get("x-api-key")

    def _is_admin(self, request: web.Request) -> bool:
        key = self._presented_key(request)
        return key is not None and hmac.compare_digest(key_hash(key), key_hash(self.admin_key))

    async def _session(self, sid: str) -> SessionState | None:
        state = self.sessions.get(sid)
        if state is None:
            record = await self.store.get_session(sid)
            if record is None:
                return None
            turns = await self.store.turns(sid)
            state = SessionState(
                sid,
                record.key_hash,
                record.meta.get("system_prompt"),
                closed=record.status == "closed",
                next_index=len(turns),
                traceparent=record.meta.get("traceparent"),
                adapter=record.meta.get("adapter"),
            )
            if not state.closed:  # closed ones are read from the store when asked for
                self.sessions[sid] = state
        return state

    def _may_use(self, request: web.Request, state: SessionState) -> bool:
        key = self._presented_key(request)
        if key is None:
            return False
        return hmac.compare_digest(key_hash(key), state.key_hash) or self._is_admin(request)

    async def create_session(self, request: web.Request) -> web.Response:
        if not self._is_admin(request):
            return error_response(OPENAI, 401, "a valid admin key is required")
        body: Any = {}
        if request.can_read_body:
            body = await read_json(request, OPENAI)
            if isinstance(body, web.Response):
                return body
        if not isinstance(body, dict):
            return error_response(OPENAI, 400, "expected a JSON object", "body")
        system_prompt = body.get("system_prompt", self.system_prompt)
        if system_prompt is not None and not isinstance(system_prompt, str):
            return error_response(OPENAI, 400, "expected a string", "system_prompt")
        adapter = body.get("adapter")
        if adapter is not None and (not isinstance(adapter, str) or not adapter):
            return error_response(OPENAI, 400, "expected an adapter's name", "adapter")
        sid, key = secrets.token_hex(16), secrets.token_urlsafe(32)
        meta = {"system_prompt": system_prompt, "metadata": body.get("metadata") or {}}
        if tp := valid_traceparent(body.get("traceparent")):  # the episode's span
            meta["traceparent"] = tp
        if adapter is not None:
            meta["adapter"] = adapter
        await self.store.create_session(sid, key_hash(key), meta)
        self.sessions[sid] = SessionState(
            sid, key_hash(key), system_prompt, traceparent=tp, adapter=adapter
        )
        base = f"{request.scheme}://{request.host}/s/{sid}"
        return web.json_response(
            {
                "session_id": sid,
                "api_key": key,
                "openai_base_url": f"{base}/v1",
                "anthropic_base_url": base,
            }
        )

    async def get_trace(self, request: web.Request) -> web.Response:
        if not self._is_admin(request):
            return error_response(OPENAI, 401, "a valid admin key is required")
        trace = await self.store.trace(request.match_info["sid"])
        if trace is None:
            return error_response(OPENAI, 404, "no such session")
        return web.Response(text=trace.model_dump_json(), content_type="application/json")

    async def close_session(self, request: web.Request) -> web.Response:
        if not self._is_admin(request):
            return error_response(OPENAI, 401, "a valid admin key is required")
        sid = request.match_info["sid"]
        state = await self._session(sid)
        if state is None or not await self.store.close_session(sid):
            return error_response(OPENAI, 404, "no such session")
        state.closed = True  # a request still in flight sees it through its own reference
        self.sessions.pop(sid, None)  # its prompts and raw assistant texts go with it
        return web.json_response({"session_id": sid, "status": "closed"})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def openapi(self, request: web.Request) -> web.Response:
        from tracerl.gateway.openapi import gateway_openapi

        return web.json_response(gateway_openapi())

    async def metrics(self, request: web.Request) -> web.Response:
        lines = ["# TYPE tracerl_gateway_events_total counter"]
        for event, count in sorted(self.counters.items()):
            lines.append(f'tracerl_gateway_events_total{{event="{event}"}} {count}')
        pool_counters = getattr(self.engine, "counters", None)  # the engine pool's transitions
        if pool_counters is not None:
            lines.append("# TYPE tracerl_pool_events_total counter")
            for event, count in sorted(pool_counters.items()):
                lines.append(f'tracerl_pool_events_total{{event="{event}"}} {count}')
        lines.append("# TYPE tracerl_gateway_sessions_open gauge")
        open_sessions = sum(not s.closed for s in self.sessions.values())
        lines.append(f"tracerl_gateway_sessions_open {open_sessions}")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # ------------------------------------------------------------------ classification

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = normalize_path(request.path)  # request.path excludes the query string
        sid = None
        match = SESSION_PATH.fullmatch(path)
        if match:
            sid, path = match.group(1), match.group(2) or "/"
        kind = _ROUTES.get((request.method, path))
        anthropic = path.startswith("/v1/messages") or (
            not path.startswith(("/v1/chat", "/v1/responses"))
            and "anthropic-version" in request.headers
        )
        dialect = ANTHROPIC if anthropic else OPENAI  # the shape of its errors
        if path.startswith("/v1/responses"):
            dialect = RESPONSES
        if sid is not None and not _SESSION_ID.fullmatch(sid):  # no session has such an id
            return error_response(dialect, 404, "no such session")
        if kind == "chat":
            return await self.generation(request, sid, OPENAI)
        if kind == "messages":
            return await self.generation(request, sid, ANTHROPIC)
        if kind == "count_tokens":
            return await self.count_tokens(request, sid)
        if kind == "models":
            state = await self._authorize(request, sid, dialect)
            if isinstance(state, web.Response):
                return state
            return web.json_response(dialect.models(self.model_name))
        if request.method in ("GET", "HEAD") and path in BASE_PATHS:
            return web.json_response({"status": "ok"})  # what clients probe before they start
        if kind == "responses":
            return await self.generation(request, sid, RESPONSES)
        return error_response(dialect, 404, f"no route for {request.method} {path}")

    async def _authorize(
        self, request: web.Request, sid: str | None, dialect: Dialect
    ) -> SessionState | web.Response | None:
        if sid is None:
            if not self._is_admin(request):
                return error_response(dialect, 401, "missing or invalid API key")
            return None
        state = await self._session(sid)
        if state is None:
            return error_response(dialect, 404, "no such session")
        if not self._may_use(request, state):
            return error_response(dialect, 401, "missing or invalid API key")
        return state

    def _adapter(self, model: Any, state: SessionState | None) -> str | None:
        """The LoRA adapter that samples a request: the one its `model` names, where the
        engines hold an adapter by that name; else its session's (`POST /sessions` with
        `adapter`); else None, the engines' default (a LoRA run's own adapter)."""
        names = getattr(self.engine, "adapter_names", None)
        known: set[str] | None = set(names()) if names is not None else None
        if isinstance(model, str) and known is not None and model in known:
            return model
        wanted = state.adapter if state is not None else None
        if wanted is not None and known is not None and wanted not in known:
            loaded = ", ".join(sorted(known)) or "none"
            raise BadRequest(
                "adapter",
                f"the session's adapter {wanted!r} is not loaded on the engines (loaded: {loaded})",
            )
        return wanted

    async def count_tokens(self, request: web.Request, sid: str | None) -> web.Response:
        body = await read_json(request, ANTHROPIC)
        if isinstance(body, web.Response):
            return body
        if isinstance(body, dict) and sid is None and "session_id" in body:
            sid = str(body.pop("session_id"))
        state = await self._authorize(request, sid, ANTHROPIC)
        if isinstance(state, web.Response):
            return state
        try:
            if not isinstance(body, dict):
                raise BadRequest("body", "expected a JSON object")
            messages = anthropic_messages(body)
            messages = with_system_prompt(messages, state.system_prompt if state else None)
            text = self.renderer.render(messages, anthropic_tools(body))
        except BadRequest as e:
            return error_response(ANTHROPIC, 400, str(e), e.param)
        self.counters["count_tokens"] += 1
        return web.json_response({"input_tokens": len(self.renderer.tokenize(text))})

    # ------------------------------------------------------------------ generations

    async def generation(
        self, request: web.Request, sid: str | None, dialect: Dialect
    ) -> web.StreamResponse:
        self._busy += 1
        span = await request_span(self.telemetry, request, sid, dialect.endpoint, self._session)
        response: web.StreamResponse | None = None
        try:
            response = await self._generation(request, sid, dialect, span)
        except Exception as e:  # a bug, not a client or engine error: still a native error
            log.exception("generation request failed")
            self.counters["internal_error"] += 1
            response = error_response(dialect, 500, f"internal gateway error: {e!r}")
        finally:
            self._busy -= 1
            end_request_span(span, request, response)
        return response

    async def _generation(
        self, request: web.Request, sid: str | None, dialect: Dialect, span: Span
    ) -> web.StreamResponse:
        body = await read_json(request, dialect)
        if isinstance(body, web.Response):
            return body
        if isinstance(body, dict) and "session_id" in body:
            body_sid = body.pop("session_id")  # the gateway's field: stripped before anything
            sid = sid or (str(body_sid) if body_sid is not None else None)
        state = await self._authorize(request, sid, dialect)
        if isinstance(state, web.Response):
            return state
        if state is not None and state.closed:
            return error_response(dialect, 409, "the session is closed")
        try:
            if not isinstance(body, dict):
                raise BadRequest("body", "expected a JSON object")
            if dialect is RESPONSES:
                body = await with_references_resolved(self.store, state, body)
            parsed = dialect.parse_request(body)
            parsed.spec.stop_token_ids = self.stop_ids
            adapter = self._adapter(body.get("model"), state)
            previous = parsed.extra.get("previous_response_id")
            if previous is not None:
                at = parsed.extra["history_at"]
                parsed.messages[at:at] = await chain(self.store, state, previous)
            plan = plan_prompt(
                self.renderer, parsed.messages, parsed.tools, state, self.history, self.turn_ends
            )
            forced = forced_call_of(parsed, self.renderer.format)
            if forced is not None:
                plan = plan.then(forced.prefix)
            schema_param = constrain(parsed, forced)
            demo = demonstration_of(
                body, dialect.endpoint, parsed, state, forced is not None, self.renderer,
                self.turn_ends,
            )  # fmt: skip
            if parsed.output_schema is not None and schema_param is None:
                self.counters["output_format_unenforced"] += 1  # the model may call a tool
        except BadRequest as e:
            return error_response(dialect, 400, str(e), e.param)
        except PreviousNotFound as e:
            return error_response(dialect, 404, str(e), "previous_response_id")
        prompt = plan.complete(await self._tokenize(plan.new_text))
        try:
            if fit_budget(parsed, len(prompt.ids), self.max_model_len, self.max_tokens_policy):
                self.counters["max_tokens_capped"] += 1
        except BadRequest as e:
            return error_response(dialect, 400, str(e), e.param)
        turn = PendingTurn(
            dialect, state, body, parsed, prompt, dialect.new_response_id(),
            forced.prefix if forced else "", demo[0] if demo else None,
        )  # fmt: skip
        self.counters[f"generation.{dialect.endpoint}.{'traced' if state else 'untraced'}"] += 1
        items = generate(
            DemonstrationEngine(demo[1]) if demo else self.engine,  # type: ignore[arg-type]
            self.tokenizer,
            prompt.ids,
            parsed.spec,
            engine_rid(sid, turn.rid),
            self.eos_ids,
            stream=parsed.stream,
            traceparent=span.traceparent,
            adapter=None if demo else adapter,  # a demonstration is the client's, not sampled
            routing=self.record_routed_experts and state is not None and not demo,
        )
        try:
            first = await anext(items)
        except (UpstreamError, EngineUnavailable, UntraceableReply) as e:
            if schema_param and isinstance(e, UpstreamError) and "json_schema" in e.message:
                what = "forced tool call's" if forced is not None else "response format's"
                why = e.message.rpartition("json_schema: ")[2]  # not the engine's field name
                return error_response(
                    dialect,
                    400,
                    f"{schema_param}: the {what} schema was refused: {why}",
                    schema_param,
                )
            return self._generation_error(dialect, e)
        if parsed.stream:
            return await self._stream(request, turn, first, items)
        completion = first
        try:
            async for item in items:
                completion = item
        except (UpstreamError, EngineUnavailable, UntraceableReply) as e:
            return self._generation_error(dialect, e)
        assert isinstance(completion, Completion)
        note_completion(request, completion)
        outcome = turn.outcome(completion, self.renderer.format)
        response = self._response(turn, outcome)
        if demo is not None:
            try:
                check_read_back(outcome, demo[0])
            except BadRequest as e:
                return error_response(dialect, 400, str(e), e.param)
        if state is not None:
            transport = request.transport
            gone = transport is None or transport.is_closing()
            failure = await self._record(turn, outcome, response, gone)
            if failure is not None:
                return error_response(dialect, 500, failure)
        return orjson_response(response)

    async def _stream(
        self,
        request: web.Request,
        turn: PendingTurn,
        first: Progress | Completion,
        items: AsyncIterator[Progress | Completion],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        writer = turn.dialect.chunk_writer(self.model_name, turn.rid, turn.parsed, self.tokenizer)
        gone = False
        try:
            await resp.prepare(request)
        except (ConnectionError, RuntimeError):  # gone before the headers: drain and record
            gone = True
            self.counters["client_disconnected"] += 1

        async def send(data: bytes) -> None:
            nonlocal gone
            if gone or not data:
                return
            try:
                await resp.write(data)
            except (ConnectionError, RuntimeError):
                gone = True  # keep generating: the turn is still recorded
                self.counters["client_disconnected"] += 1

        emitted, completion = "", None

        async def show(item: Progress | Completion) -> None:
            nonlocal emitted, completion
            if isinstance(item, Completion):
                completion = item
            elif not turn.forced:  # a forced call: no text
                safe = self.renderer.format.streamable(item.text)
                if safe is not None and len(safe) > len(emitted) and safe.startswith(emitted):
                    await send(writer.text(safe[len(emitted) :], item.ids, item.logprobs))
                    emitted = safe

        try:  # after the 200 went out, every failure is an error event
            await send(writer.start(len(turn.prompt.ids)))
            await show(first)
            async for item in items:
                await show(item)
            assert completion is not None
            note_completion(request, completion)
            outcome = turn.outcome(completion, self.renderer.format)
            content = outcome.parsed.content
            rest = content[len(emitted) :] if content.startswith(emitted) else ""
            await send(writer.finish(outcome, rest))
            status, failure = 500, None
            if turn.state is not None:
                failure = await self._record(turn, outcome, self._response(turn, outcome), gone)
        except Exception as e:
            status, failure = classify(e)
            if status == 500 and not isinstance(e, UntraceableReply):
                log.exception("streamed generation failed")
            self.counters["generation_failed"] += 1
        if failure is not None:
            request[STREAM_ERROR_KEY] = failure
            await send(writer.error(status, failure))
            return await close_stream(resp)
        await send(writer.end())
        return await close_stream(resp)

    async def _tokenize(self, text: str) -> list[int]:
        """Tokenize inline when this is the only request (a thread hop would only add latency);
        under load on a worker thread, since the tokenizer releases the GIL and other requests
        can run meanwhile."""
        if self._busy <= 1:
            return self.renderer.tokenize(text)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, self.renderer.tokenize, text)

    def _response(self, turn: PendingTurn, outcome: Outcome) -> dict[str, Any]:
        return turn.dialect.response(
            outcome, turn.parsed, self.model_name, turn.rid, self.tokenizer
        )

    def _generation_error(self, dialect: Dialect, error: Exception) -> web.Response:
        status, message = classify(error)
        self.counters["generation_failed"] += 1
        return error_response(dialect, status, message)

    async def _record(
        self,
        turn: PendingTurn,
        outcome: Outcome,
        response: dict[str, Any],
        client_disconnected: bool,
    ) -> str | None:
        """Commit the turn; on failure log it and return the message the caller must see."""
        assert turn.state is not None
        try:
            await commit_turn(self.store, turn, outcome, response, client_disconnected)
        except Exception as e:
            log.exception("recording a turn of session %s failed", turn.state.session_id)
            self.counters["record_failed"] += 1
            return f"the turn could not be recorded: {e}"
        self.counters["turns_recorded"] += 1
        return None


def engine_rid(sid: str | None, response_id: str) -> str:
    """The engine request id, `SESSION-RESPONSE`: the pool keeps a session on one engine by its
    first part (`affinity_key`). An untraced request is a session of its own, so untraced
    traffic spreads over the engines instead of all sharing one key."""
    session = sid or "untraced_" + response_id.replace("-", "_")
    return f"{session}-{response_id}"


__all__ = ["Gateway", "StoreError", "key_hash", "normalize_path"]
