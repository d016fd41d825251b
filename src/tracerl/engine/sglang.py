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
- LoRA adapters (launched with `engine.lora_rank`: `--enable-lora`): `/load_lora_adapter`
  loads each pushed version under a name of its own, `/unload_lora_adapter` drops old ones and
  `/update_weight_version` sets the version (`tracerl.engine.served_adapters`); a request's
  `lora_path` is sent as that adapter's newest version, whose number labels its tokens;
- routed experts (`return_routed_experts`, a server launched with
  `--enable-return-routed-experts`, which the launcher passes for a MoE model) come as base64
  of raw int32 rows `[tokens - 1, layers, top_k]` without their shape: the client is given the
  model's layout (`tracerl.routing.moe_layout`) and returns them as tracerl's record; without a
  layout (a dense model) it does not ask;
- `/metrics` carries `sglang:*` names (the collector reads them beside vLLM's); streaming
  returns only new tokens per chunk when the server runs with `--incremental-streaming-output`,
  which `tracerl.rollout.backends` passes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from tracerl.engine.client import (
    EngineClient,
    EngineHTTPError,
    EngineReplyError,
    output_from_wire,
    version_label,
)
from tracerl.engine.served_adapters import ServedAdapters, settle
from tracerl.engine.types import GenerateOutput, GenerateRequest, WeightLoadError
from tracerl.routing import from_sglang


class SGLangClient(EngineClient):
    serves_lora_adapters = True

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 600.0,
        api_key: str | None = None,
        routing: tuple[int, int, int] | None = None,
    ) -> None:
        """`routing`: the served model's MoE `(layers, top_k, experts)`
        (`tracerl.routing.moe_layout`), which SGLang's routed experts need; None: requests
        never ask for them."""
        super().__init__(base_url, timeout_s, api_key)
        self.served = ServedAdapters()
        self.sglang_routing = routing

    def _to_served(self, request: GenerateRequest) -> tuple[GenerateRequest, int | None]:
        """`request` naming its adapter's newest version, and that version (None: the base,
        or an adapter this client did not load, sent as named)."""
        newest = self.served.newest(request.lora_path) if request.lora_path else None
        if newest is None:
            return request, None
        return request.model_copy(update={"lora_path": newest[0]}), newest[1]

    @staticmethod
    def _labelled(chunk: GenerateOutput, version: int | None) -> GenerateOutput:
        if version is not None:  # SGLang's label is its global version, not the adapter's
            chunk.weight_version, chunk.weight_version_min = version, None
        return chunk

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        sent, version = self._to_served(request)
        return self._labelled(await super().generate(sent), version)

    async def generate_stream(
        self, request: GenerateRequest
    ) -> AsyncGenerator[GenerateOutput, None]:
        sent, version = self._to_served(request)
        async for chunk in super().generate_stream(sent):
            yield self._labelled(chunk, version)

    def _output(self, payload: Any) -> GenerateOutput:
        """`output_from_wire`, with SGLang's routed experts (raw int32 rows without their
        shape) read with the model's layout."""
        meta = payload.get("meta_info") if isinstance(payload, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("routed_experts"), str):
            return output_from_wire(payload)
        raw = meta["routed_experts"]
        out = output_from_wire({**payload, "meta_info": {**meta, "routed_experts": None}})
        try:
            if self.sglang_routing is None:
                raise ValueError("SGLang's raw form, but this client knows no MoE layout")
            tokens = out.prompt_tokens + out.completion_tokens
            out.routed_experts = from_sglang(raw, self.sglang_routing, tokens)
        except ValueError as e:
            raise EngineReplyError(f"meta_info.routed_experts: {e}") from None
        return out

    def _wire(self, request: GenerateRequest, stream: bool) -> dict[str, Any]:
        body = super()._wire(request, stream)
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
        if self.sglang_routing is None:  # a dense model, or routing not recorded
            body.pop("return_routed_experts", None)
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

    async def load_lora_adapter(self, name: str, path: str, weight_version: int) -> None:
        """Version `weight_version` of adapter `name` from peft's directory `path` (which must
        not change after), under its own served name; older versions are unloaded."""
        served = self.served.served_name(name, weight_version)
        reply, refused = await self._load(served, path)
        if refused and "already loaded" in _why(reply):  # an attached server, a resumed run
            await self._request("POST", "/unload_lora_adapter", {"lora_name": served})
            reply, refused = await self._load(served, path)
        if refused:
            raise WeightLoadError(f"SGLang could not load adapter {path}: {_why(reply)}")
        await settle(self._request, self.served, name, weight_version, "/unload_lora_adapter")

    async def _load(self, served: str, path: str) -> tuple[Any, bool]:
        """SGLang's reply to loading `path` as `served`, and whether it refused."""
        try:
            reply = await self._request(
                "POST", "/load_lora_adapter", {"lora_name": served, "lora_path": path}
            )
        except EngineHTTPError as e:
            if e.status >= 500:
                raise
            return e.body, True
        return reply, isinstance(reply, dict) and reply.get("success") is False

    def adapter_names(self) -> set[str]:
        return self.served.names()

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
        info["adapters"] = {n: v[-1] for n, v in self.served.versions.items()}
        return info


def _why(reply: Any) -> str:
    """SGLang's reason in a failed reply (`error_message` or `message`), else the reply."""
    if isinstance(reply, dict):
        return str(reply.get("error_message") or reply.get("message") or reply)
    return str(reply)
