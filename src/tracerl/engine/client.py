"""An `Engine` reached over the engine wire protocol (HTTP): tracerl engines or SGLang servers."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import orjson

from tracerl.engine.protocol import PauseMode
from tracerl.engine.types import GenerateOutput, GenerateRequest

_JSON_HEADERS = {"Content-Type": "application/json"}


class EngineHTTPError(RuntimeError):
    """A non-2xx reply; `status` and the decoded `body` are kept for callers that pass it on."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"engine replied {status}: {body}")
        self.status, self.body = status, body


class EngineReplyError(RuntimeError):
    """A 2xx reply that is not a well-formed generation (the caller must not trust it)."""


_FINISH_TYPES = ("stop", "length", "abort")


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
    return GenerateOutput(
        rid=str(meta.get("id", "")),
        output_ids=ids,
        output_logprobs=logprobs,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", 0)),
        weight_version=int(meta.get("weight_version", 0)),
        finish_reason=finish["type"] if finish else None,
        text=str(payload.get("text", "")),
        matched_stop=finish.get("matched") if finish else None,
        weight_version_min=meta.get("weight_version_min"),
    )


def _json_or_text(raw: bytes) -> Any:
    """A reply body as JSON, or as text when it is not JSON (an empty body is "")."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


class EngineClient:
    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
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
            payload = _json_or_text(await resp.read())
            if resp.status >= 300:
                raise EngineHTTPError(resp.status, payload)
            return payload

    @staticmethod
    def _wire(request: GenerateRequest, stream: bool) -> dict[str, Any]:
        body = request.model_dump()
        body["stream"] = stream
        return body

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        return output_from_wire(
            await self._request("POST", "/generate", self._wire(request, False))
        )

    async def generate_stream(
        self, request: GenerateRequest
    ) -> AsyncGenerator[GenerateOutput, None]:
        http = await self._http()
        wire = orjson.dumps(self._wire(request, True))
        async with http.post(self.base_url + "/generate", data=wire, headers=_JSON_HEADERS) as resp:
            if resp.status >= 300:
                raise EngineHTTPError(resp.status, _json_or_text(await resp.read()))
            if resp.content_type != "text/event-stream":  # a whole reply instead of a stream
                yield output_from_wire(_json_or_text(await resp.read()))
                return
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
                yield output_from_wire(payload)
        raise EngineReplyError("stream ended without [DONE]")

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
        return dict(await self._request("GET", "/get_model_info"))

    async def metrics_text(self) -> str:
        http = await self._http()
        async with http.get(self.base_url + "/metrics") as resp:
            if resp.status >= 300:
                raise EngineHTTPError(resp.status, await resp.text())
            return await resp.text()
