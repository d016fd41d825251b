"""An `Engine` reached over the engine wire protocol (HTTP): tracerl engines or SGLang servers."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import orjson

from tracerl.engine.protocol import PauseMode
from tracerl.engine.types import GenerateOutput, GenerateRequest
from tracerl.routing import RoutedExperts

_JSON_HEADERS = {"Content-Type": "application/json"}


class EngineHTTPError(RuntimeError):
    """A non-2xx reply; `status` and the decoded `body` are kept for callers that pass it on."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"engine replied {status}: {body}")
        self.status, self.body = status, body


class EngineReplyError(RuntimeError):
    """A 2xx reply that is not a well-formed generation (the caller must not trust it)."""


_FINISH_TYPES = ("stop", "length", "abort")


def version_label(label: Any) -> int:
    """An engine's weight-version label as tracerl's integer version. vLLM and SGLang label
    weights with strings, "default" until the first update: the base weights, version 0."""
    try:
        return int(label)
    except (TypeError, ValueError):
        return 0


def output_from_wire(payload: Any) -> GenerateOutput:
    """Validate one `/generate` reply or stream chunk; `EngineReplyError` if malformed."""
    if not isinstance(payload, dict):
        raise EngineReplyError(f"reply is not a JSON object: {str(payload)[:100]}")
    meta = payload.get("meta_info")
    if not isinstance(meta, dict):
        raise EngineReplyError("reply has no meta_info object")
    pairs = meta.get("output_token_logprobs")
    if not isinstance(pairs, list):
        raise EngineReplyError("reply has no output_token_logprobs list")
    try:
        logprobs = [float(p[0]) for p in pairs]
        ids = [int(p[1]) for p in pairs]
    except (TypeError, ValueError, IndexError):
        raise EngineReplyError("output_token_logprobs entries are not [logprob, id, ...]") from None
    if "output_ids" in payload and list(payload["output_ids"]) != ids:
        raise EngineReplyError("output_ids and output_token_logprobs disagree")
    finish = meta.get("finish_reason")
    if finish is not None and (
        not isinstance(finish, dict) or finish.get("type") not in _FINISH_TYPES
    ):
        raise EngineReplyError(f"unknown finish_reason {finish!r}")
    spans = [version_label(s.get("version")) for s in meta.get("weight_versions") or ()]
    version = version_label(meta.get("weight_version", 0))
    oldest = meta.get("weight_version_min")
    if spans and min(spans) != version:  # SGLang and vLLM label every token's weights
        oldest = min(spans)
    routing = None
    if meta.get("routed_experts") is not None:
        try:
            routing = RoutedExperts.model_validate(meta["routed_experts"]).array()
        except ValueError as e:
            raise EngineReplyError(f"meta_info.routed_experts: {e}") from None
    return GenerateOutput(
        rid=str(meta.get("id", "")),
        output_ids=ids,
        output_logprobs=logprobs,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", 0)),
        weight_version=version,
        finish_reason=finish["type"] if finish else None,
        text=str(payload.get("text", "")),
        matched_stop=finish.get("matched") if finish else None,
        weight_version_min=oldest,
        routed_experts=routing,
    )


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncGenerator[Any, None]:
    """The JSON payloads of a server-sent event stream up to its `data: [DONE]`. An error
    event (`{"error": ...}`, as vLLM and SGLang send mid-stream) is an `EngineHTTPError` 500;
    a stream that ends without `[DONE]` or carries a non-JSON event is an `EngineReplyError`."""
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            raise EngineReplyError(f"stream event is not JSON: {data[:100]}") from None
        if isinstance(payload, dict) and "error" in payload:
            raise EngineHTTPError(500, payload)
        yield payload
    raise EngineReplyError("stream ended without [DONE]")


def json_or_text(raw: bytes) -> Any:
    """A reply body as JSON, or as text when it is not JSON (an empty body is "")."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


IDLE_CONNECTION_S = 3.0
"""An idle connection is closed after this long, before the server would close it (uvicorn's
default, vLLM's and SGLang's servers, is 5 s; aiohttp's client default of 15 s let a request go
out on a connection the server was closing: `Can not write request body`, measured with vLLM)."""


def engine_http_session(read_timeout_s: float, api_key: str | None = None) -> aiohttp.ClientSession:
    """An HTTP session for talking to one engine: `read_timeout_s` bounds the wait for each
    piece of a reply (a stream's next chunk), never the whole of it, so a long generation is
    not cut; no connection limit (aiohttp's default is 100), so the engine, not tracerl, owns
    the queueing of requests beyond what it runs; idle connections closed before the server's
    keep-alive ends."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=read_timeout_s),
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=IDLE_CONNECTION_S),
        headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
    )


class EngineClient:
    serves_lora_adapters = True
    """The server loads LoRA adapters by name (`load_lora_adapter`): tracerl's engine server."""

    def __init__(self, base_url: str, timeout_s: float = 600.0, api_key: str | None = None) -> None:
        """`timeout_s`: the longest wait for any one reply chunk (not the whole reply);
        `api_key`: sent as a bearer token on every request (an engine that requires one)."""
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._api_key = api_key
        self._session: aiohttp.ClientSession | None = None
        self._adapters: set[str] = set()
        """The LoRA adapters the server reported at its last `model_info`."""

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = engine_http_session(self.timeout_s, self._api_key)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        http = await self._http()
        data = orjson.dumps(body) if body is not None else None
        async with http.request(
            method, self.base_url + path, data=data, headers=_JSON_HEADERS
        ) as resp:
            payload = json_or_text(await resp.read())
            if resp.status >= 300:
                raise EngineHTTPError(resp.status, payload)
            return payload

    def _output(self, payload: Any) -> GenerateOutput:
        """One reply or stream chunk as validated output (a backend's own forms: override)."""
        return output_from_wire(payload)

    def _wire(self, request: GenerateRequest, stream: bool) -> dict[str, Any]:
        body = request.model_dump()
        body["stream"] = stream
        return body

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        return self._output(await self._request("POST", "/generate", self._wire(request, False)))

    async def generate_stream(
        self, request: GenerateRequest
    ) -> AsyncGenerator[GenerateOutput, None]:
        http = await self._http()
        wire = orjson.dumps(self._wire(request, True))
        async with http.post(self.base_url + "/generate", data=wire, headers=_JSON_HEADERS) as resp:
            if resp.status >= 300:
                raise EngineHTTPError(resp.status, json_or_text(await resp.read()))
            if resp.content_type != "text/event-stream":  # a whole reply instead of a stream
                yield self._output(json_or_text(await resp.read()))
                return
            async for payload in sse_events(resp):
                yield self._output(payload)

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        body = {"abort_all": True} if abort_all else {"rid": rid}
        return int((await self._request("POST", "/abort_request", body))["aborted"])

    async def pause(self, mode: PauseMode = "in_place") -> None:
        await self._request("POST", "/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self._request("POST", "/continue_generation", {})

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        await self._request(
            "POST",
            "/update_weights_from_disk",
            {"model_path": model_path, "weight_version": weight_version},
        )

    async def load_lora_adapter(self, name: str, path: str, weight_version: int) -> None:
        """Load (or replace) LoRA adapter `name` from peft's directory `path` on the server."""
        await self._request(
            "POST",
            "/load_lora_adapter",
            {"lora_name": name, "lora_path": path, "weight_version": weight_version},
        )

    async def _answers(self, path: str) -> bool:
        try:
            await self._request("GET", path)
        except (aiohttp.ClientError, EngineHTTPError, TimeoutError):
            return False
        return True

    async def health(self) -> bool:
        return await self._answers("/health")

    async def health_generate(self) -> bool:
        return await self._answers("/health_generate")

    async def model_info(self) -> dict[str, Any]:
        info = dict(await self._request("GET", "/get_model_info"))
        self._adapters = set(info.get("adapters") or ())
        return info

    def adapter_names(self) -> set[str]:
        """The LoRA adapters a request may name: the server's, as of its last `model_info`
        (the pool reads it after every weight push)."""
        return set(self._adapters)

    async def metrics_text(self) -> str:
        http = await self._http()
        async with http.get(self.base_url + "/metrics") as resp:
            if resp.status >= 300:
                raise EngineHTTPError(resp.status, await resp.text())
            return await resp.text()
