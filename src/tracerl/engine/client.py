"""An `Engine` reached over the engine wire protocol (HTTP): tracerl engines or SGLang servers."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from tracerl.engine.protocol import PauseMode
from tracerl.engine.types import GenerateOutput, GenerateRequest


class EngineHTTPError(RuntimeError):
    """A non-2xx reply; `status` and the decoded `body` are kept for callers that pass it on."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"engine replied {status}: {body}")
        self.status, self.body = status, body


def output_from_wire(payload: dict[str, Any]) -> GenerateOutput:
    meta = payload["meta_info"]
    pairs = meta.get("output_token_logprobs") or []
    finish = meta.get("finish_reason")
    return GenerateOutput(
        rid=meta["id"],
        output_ids=[int(p[1]) for p in pairs] or list(payload.get("output_ids", [])),
        output_logprobs=[float(p[0]) for p in pairs],
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", 0)),
        weight_version=int(meta.get("weight_version", 0)),
        finish_reason=finish["type"] if finish else None,
        text=payload.get("text", ""),
        matched_stop=finish.get("matched") if finish else None,
    )


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
        async with http.request(method, self.base_url + path, json=body) as resp:
            text = await resp.text()
            try:
                payload = json.loads(text) if text else None
            except json.JSONDecodeError:
                payload = text
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
        async with http.post(self.base_url + "/generate", json=self._wire(request, True)) as resp:
            if resp.status >= 300:
                raise EngineHTTPError(resp.status, await resp.text())
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                payload = json.loads(data)
                if "error" in payload:
                    raise EngineHTTPError(500, payload)
                yield output_from_wire(payload)
        raise EngineHTTPError(502, "stream ended without [DONE]")

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
