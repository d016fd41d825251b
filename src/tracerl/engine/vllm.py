"""The vLLM adapter: the `Engine` protocol on top of a vLLM (0.32) server's own HTTP API.

A client, not a proxy: the pool talks to vLLM directly, and vLLM's scheduler is the only one.
What each part of the protocol maps onto (the server runs with `--enable-scale-out` and
`VLLM_SERVER_DEV_MODE=1`, which `tracerl.rollout.backends` sets when it launches one):

- generation: `POST /inference/v1/generate`, token ids in and out, `logprobs: 0` (the sampled
  token's log-prob only), streamed; vLLM labels each output token with the weight version that
  sampled it (`weight_versions` spans on the final chunk), which becomes `weight_version_min`
  and `weight_version` here. Log-probs are the ones vLLM sampled from; launched with
  `--logprobs-mode processed_logprobs` they are the temperature-scaled distribution, the
  embedded engine's and the trainer's (with top-p or top-k below 1 vLLM renormalises over the
  kept tokens, the embedded engine does not).
- abort: `POST /abort_requests` (the stream then ends with `finish_reason: "abort"` and the
  partial output, which the pool resumes).
- pause / resume: `POST /pause?mode=keep&clear_cache=false` (in place: requests keep their KV;
  vLLM's default `clear_cache` would preempt them all) or `mode=abort`, and `POST /resume`.
- weights from disk: `POST /collective_rpc` `reload_weights(weights_path=...)` (in place, no
  restart), `POST /reset_prefix_cache?reset_running_requests=true` (vLLM keeps its prefix
  cache across a reload), then `POST /update_weight_version`; the version is read back from
  `/weight_info`.
- LoRA adapters (a server launched with `engine.lora_rank`, `--enable-lora` and
  `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`): `POST /v1/load_lora_adapter` loads each pushed
  version under a name of its own and `/v1/unload_lora_adapter` drops old ones
  (`tracerl.engine.served_adapters`); a request's `lora_path` becomes the generate request's
  `model`, the adapter's newest version, and its tokens are labelled with that version. No
  prefix-cache reset: vLLM keys cached blocks by adapter name and path.
- `/health`; `health_generate` generates one token; `model_info` reads `/v1/models` and
  `/weight_info`; `/metrics` is vLLM's own, the names the collector reads, plus
  `tracerl:paused` from `/is_paused`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from tracerl.engine.client import (
    _JSON_HEADERS,
    EngineClient,
    EngineHTTPError,
    EngineReplyError,
    json_or_text,
    sse_events,
    version_label,
)
from tracerl.engine.protocol import PauseMode, collect
from tracerl.engine.served_adapters import ServedAdapters, settle
from tracerl.engine.types import GenerateOutput, GenerateRequest, WeightLoadError

_PAUSE = {"in_place": "keep", "retract": "keep", "abort": "abort"}
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class VLLMClient(EngineClient):
    serves_lora_adapters = True

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 600.0,
        seeds: bool = True,
        api_key: str | None = None,
        default_max_new_tokens: int | None = None,
    ) -> None:
        """`seeds=False` sends requests unseeded: vLLM's CPU build dies (`RuntimeError: CPU
        Generator does not use offset`, then `EngineDeadError`) on concurrent seeded requests
        (measured: 64 at temperature 0.7, `tracerl bench engine --backend vllm --quick`).
        `default_max_new_tokens`: the budget of a request that gives none, capped by the room
        its context leaves (`engine.default_max_new_tokens`, as the embedded engine does);
        None: the whole room."""
        super().__init__(base_url, timeout_s, api_key)
        self.seeds = seeds
        self.default_max_new_tokens = default_max_new_tokens
        self._max_model_len: int | None = None
        self._weight_version: int | None = None
        """The version this client last loaded or read (the final chunk's spans are vLLM's
        own word for every token; this labels the chunks before it)."""
        self.served = ServedAdapters()

    async def _max_len(self) -> int:
        if self._max_model_len is None:
            self._max_model_len = int((await self._model())["max_model_len"])
        return self._max_model_len

    async def _model(self) -> dict[str, Any]:
        models = await self._request("GET", "/v1/models")
        try:
            return dict(models["data"][0])
        except (KeyError, IndexError, TypeError):
            raise EngineReplyError(f"/v1/models lists no model: {str(models)[:200]}") from None

    async def _body(
        self, request: GenerateRequest, stream: bool, adapter: tuple[str, int] | None = None
    ) -> dict[str, Any]:
        """vLLM's generate request; `adapter`: the served name and version of the request's
        LoRA adapter, when this client loaded it."""
        p = request.sampling_params
        max_tokens = p.max_new_tokens
        if max_tokens is None:
            max_tokens = max(1, await self._max_len() - len(request.input_ids))
            if self.default_max_new_tokens is not None:
                max_tokens = min(max_tokens, self.default_max_new_tokens)
        params: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k if p.top_k > 0 else -1,
            "stop_token_ids": p.stop_token_ids,
            "ignore_eos": p.ignore_eos,
            "logprobs": 0,
            "detokenize": False,
            "skip_special_tokens": False,
        }
        if p.seed is not None and self.seeds:
            params["seed"] = p.seed
        # vLLM's structured outputs; compact as ours (vLLM 0.32 takes that from its server's
        # config, which a launched server gets; the request's flag is for later versions)
        if p.json_schema is not None:
            params["structured_outputs"] = {
                "json": orjson.loads(p.json_schema),
                "disable_any_whitespace": True,
            }
        body = {
            "request_id": request.rid,
            "token_ids": request.input_ids,
            "sampling_params": params,
            "stream": stream,
            "output_mode": "tokens",
        }
        if request.lora_path is not None:  # its newest version here, or a name vLLM knows
            body["model"] = adapter[0] if adapter else request.lora_path
        return body

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        return await collect(self.generate_stream(request))

    async def generate_stream(
        self, request: GenerateRequest
    ) -> AsyncGenerator[GenerateOutput, None]:
        http = await self._http()
        # the version a push may replace while this request starts: looked up once
        adapter = self.served.newest(request.lora_path) if request.lora_path else None
        wire = await self._body(request, True, adapter)
        done = 0
        async with http.post(
            self.base_url + "/inference/v1/generate", data=orjson.dumps(wire), headers=_JSON_HEADERS
        ) as resp:
            if resp.status >= 300:
                raise EngineHTTPError(resp.status, json_or_text(await resp.read()))
            if self._weight_version is None:
                self._weight_version = await self._served_version()
            version = self._weight_version
            adapter_version = adapter[1] if adapter else None  # it samples the whole request
            async for payload in sse_events(resp):
                chunk = self._chunk(payload, request, done, version, adapter_version)
                done += len(chunk.output_ids)
                yield chunk
                if chunk.finish_reason is not None:
                    return
        raise EngineReplyError("stream ended without a finish reason")

    @staticmethod
    def _chunk(
        payload: Any,
        request: GenerateRequest,
        done: int,
        version: int,
        adapter_version: int | None = None,
    ) -> GenerateOutput:
        """One stream event as a chunk; `EngineReplyError` if it is not a tokens chunk.
        `adapter_version`: the adapter version the request was sent to, which labels every
        token (vLLM's labels are the global version)."""
        try:
            choice = payload["choices"][0]
            ids = [int(t) for t in choice.get("token_ids") or []]
            content = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [float(entry["logprob"]) for entry in content]
            returned = [int(entry["token_id"]) for entry in content]
        except (KeyError, IndexError, TypeError, ValueError):
            raise EngineReplyError(f"not a generate chunk: {str(payload)[:200]}") from None
        if returned != ids:
            raise EngineReplyError("token_ids and their logprobs disagree")
        reason = choice.get("finish_reason")
        finish = _FINISH.get(reason) if reason is not None else None
        if reason is not None and finish is None:
            raise EngineReplyError(f"unknown finish_reason {reason!r}")
        spans = choice.get("weight_versions") or []
        versions = [version_label(span.get("version")) for span in spans if isinstance(span, dict)]
        if adapter_version is not None:
            versions = [adapter_version]
        stop = choice.get("stop_reason")
        return GenerateOutput(
            rid=request.rid,
            output_ids=ids,
            output_logprobs=logprobs,
            prompt_tokens=len(request.input_ids),
            completion_tokens=done + len(ids),
            weight_version=versions[-1] if versions else version,
            finish_reason=finish,  # type: ignore[arg-type]
            matched_stop=stop if isinstance(stop, int) else None,
            weight_version_min=min(versions)
            if versions and min(versions) != versions[-1]
            else None,
        )

    async def _served_version(self) -> int:
        return version_label((await self._request("GET", "/weight_info")).get("weight_version"))

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        # the generate endpoint names its requests `generate-tokens-<request_id>`
        body: dict[str, Any] = {} if abort_all else {"request_ids": [f"generate-tokens-{rid}"]}
        return int((await self._request("POST", "/abort_requests", body)).get("aborted", 0))

    async def pause(self, mode: PauseMode = "in_place") -> None:
        # clear_cache would preempt every running request (measured: 8 "preemptions" per
        # in-place pause, read by the controller as overload): in place keeps their KV
        clear = "false" if _PAUSE[mode] == "keep" else "true"
        await self._request("POST", f"/pause?mode={_PAUSE[mode]}&clear_cache={clear}", {})

    async def resume(self) -> None:
        await self._request("POST", "/resume", {})

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        # vLLM's engine dies on a path it cannot load (measured with 0.32): refuse one that
        # is not a weights directory here, where this client can see the server's disk
        local = urlsplit(self.base_url).hostname in ("127.0.0.1", "localhost", "::1")
        if local and not any(Path(model_path).glob("*.safetensors")):
            raise WeightLoadError(f"{model_path}: no *.safetensors weights there")
        try:
            await self._request(
                "POST",
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": model_path}},
            )
        except EngineHTTPError as e:
            raise WeightLoadError(f"vLLM could not load {model_path}: {e.body}") from None
        # vLLM keeps its prefix cache across a reload: K/V the old weights computed would serve
        # the next request that shares a prefix. It can only be emptied with every block free,
        # so the running requests are preempted too (vLLM recomputes them, under the new weights).
        await self._request("POST", "/reset_prefix_cache?reset_running_requests=true", {})
        await self._request("POST", "/update_weight_version", {"new_version": str(weight_version)})
        self._weight_version = weight_version

    async def load_lora_adapter(self, name: str, path: str, weight_version: int) -> None:
        """Version `weight_version` of adapter `name` from peft's directory `path` (which must
        not change after), under its own served name; older versions are unloaded."""
        served = self.served.served_name(name, weight_version)
        body = {"lora_name": served, "lora_path": path}
        try:
            try:
                await self._request("POST", "/v1/load_lora_adapter", body)
            except EngineHTTPError as e:  # loaded before (an attached server, a resumed run)
                if e.status != 400 or "already been loaded" not in str(e.body):
                    raise
                await self._request("POST", "/v1/unload_lora_adapter", {"lora_name": served})
                await self._request("POST", "/v1/load_lora_adapter", body)
        except EngineHTTPError as e:
            if e.status == 404:
                raise WeightLoadError(
                    f"vLLM at {self.base_url} does not load LoRA adapters: launch it with "
                    "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (engine.lora_rank "
                    "does both for launched servers)"
                ) from None
            raise WeightLoadError(f"vLLM could not load adapter {path}: {e.body}") from None
        await settle(self._request, self.served, name, weight_version, "/v1/unload_lora_adapter")
        self._weight_version = weight_version

    def adapter_names(self) -> set[str]:
        return self.served.names()

    async def health_generate(self) -> bool:
        probe = GenerateRequest.model_validate(
            {"input_ids": [1], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        )
        with contextlib.suppress(Exception):
            return len((await self.generate(probe)).output_ids) == 1
        return False

    async def model_info(self) -> dict[str, Any]:
        model = await self._model()
        self._max_model_len = int(model["max_model_len"])
        self._weight_version = await self._served_version()
        return {
            "model_path": model.get("root") or model.get("id"),
            "max_model_len": self._max_model_len,
            "weight_version": self._weight_version,
            "adapters": {n: v[-1] for n, v in self.served.versions.items()},
            "backend": "vllm",
        }

    async def metrics_text(self) -> str:
        text = await super().metrics_text()
        paused = bool((await self._request("GET", "/is_paused")).get("is_paused"))
        return (
            text.rstrip("\n")
            + "\n# HELP tracerl:paused 1 while generation is paused.\n# TYPE tracerl:paused gauge\n"
            + f"tracerl:paused {float(paused)!r}\n"
        )
