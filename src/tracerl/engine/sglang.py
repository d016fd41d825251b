"""An SGLang server behind the `Engine` protocol.

The engine wire protocol is SGLang's own (`/generate`, `/abort_request`, `/pause_generation`,
`/continue_generation`, `/update_weights_from_disk`), so this client differs from
`EngineClient` only where SGLang (0.5.14 and later) does:

- the per-request seed is `sampling_params.sampling_seed` (SGLang rejects unknown sampling
  keys, and honours seeds only when launched with `--enable-deterministic-inference`);
- `/abort_request` answers with an empty body (SGLang matches rids by prefix: a resumed
  attempt `RID-a2` is aborted with `RID`, which is what the pool wants);
- `/update_weights_from_disk` answers `{"success": false, "message": ...}` with HTTP 400 when
  the weights cannot be loaded, and takes the version label (`weight_version`) with them;
- the model and its weight version come from `/model_info`; the KV capacity from
  `/server_info`;
- `/metrics` carries `sglang:*` names (the collector reads them beside vLLM's); streaming
  returns only new tokens per chunk when the server runs with `--incremental-streaming-output`,
  which `tracerl.rollout.backends` passes.
"""

from __future__ import annotations

from typing import Any

from tracerl.engine.client import EngineClient, EngineHTTPError, version_label
from tracerl.engine.types import GenerateRequest, WeightLoadError


class SGLangClient(EngineClient):
    serves_lora_adapters = False  # its LoRA API is not wired in yet: merged exports

    @staticmethod
    def _wire(request: GenerateRequest, stream: bool) -> dict[str, Any]:
        body = EngineClient._wire(request, stream)
        params = body["sampling_params"]
        seed = params.pop("seed", None)
        if seed is not None:
            params["sampling_seed"] = seed
        if params.get("max_new_tokens") is None:
            params.pop("max_new_tokens", None)  # SGLang's default budget, capped by the context
        if params.get("top_k", -1) <= 0:
            params.pop("top_k", None)  # SGLang's "all tokens" is its default, not -1
        if params.get("json_schema") is None:
            params.pop("json_schema", None)  # unconstrained; a schema is SGLang's own field
        return body

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        await self._request(
            "POST", "/abort_request", {"abort_all": True} if abort_all else {"rid": rid}
        )
        return 1 if not abort_all else 0  # SGLang does not say how many it aborted

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        try:
            reply = await self._request(
                "POST",
                "/update_weights_from_disk",
                {"model_path": model_path, "weight_version": str(weight_version)},
            )
        except EngineHTTPError as e:
            if e.status >= 500:
                raise
            raise WeightLoadError(f"SGLang could not load {model_path}: {e.body}") from None
        if isinstance(reply, dict) and reply.get("success") is False:
            raise WeightLoadError(f"SGLang could not load {model_path}: {reply.get('message')}")

    async def model_info(self) -> dict[str, Any]:
        info = dict(await self._request("GET", "/model_info"))
        server = await self._request("GET", "/server_info")
        info["weight_version"] = version_label(info.get("weight_version"))
        if isinstance(server, dict):
            info["kv_cache_tokens"] = server.get("max_total_num_tokens")
        if not info.get("max_model_len"):
            models = await self._request("GET", "/v1/models")
            info["max_model_len"] = int(models["data"][0]["max_model_len"])
        info["backend"] = "sglang"
        return info
