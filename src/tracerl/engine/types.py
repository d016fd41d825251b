"""The engine wire protocol's request and reply shapes (SGLang-native), validated with pydantic.

A request that fails validation is answered with HTTP 400 and an error naming the field, e.g.
`sampling_params.max_new_tokens: ...`. Checks that need the model (id range, context length) live
in the engine, which raises `RequestError` with the same kind of message.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.json_schema import SkipJsonSchema

from tracerl.routing import RoutedExperts

FinishType = Literal["stop", "length", "abort"]


class RequestError(ValueError):
    """A request the engine cannot serve as asked; `field` is the dotted path of the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class WeightLoadError(ValueError):
    """New weights that cannot be loaded; the engine keeps serving its previous weights."""


class PoolError(RuntimeError):
    """A request an engine pool could not complete on any engine; the message says why. (Here,
    beside the engine types, so that the gateway needs no import of the pool.)"""


class EngineError(RuntimeError):
    """The engine failed while running a request (the request gets no result)."""


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="ignore")

    max_new_tokens: int | None = Field(default=None, ge=1)
    """Completion budget; unset means the engine default, capped by the context length."""
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    """0 is greedy decoding."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    """-1 (or 0) disables top-k."""
    stop_token_ids: list[int] = Field(default_factory=list)
    """Generation stops after sampling one of these (the stop token is part of the output)."""
    ignore_eos: bool = False
    """Do not stop on the model's end-of-sequence tokens (only on `stop_token_ids` and length)."""
    seed: int | None = None
    """Same seed and inputs give the same tokens."""
    json_schema: str | None = None
    """A JSON schema (as a JSON string, SGLang's field) the output must match: tokens that
    would leave it are masked, and the generation ends when the value is complete (the
    simulated engine ignores it)."""

    @field_validator("json_schema")
    @classmethod
    def _schema_is_a_json_object(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            value = json.loads(v)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError("expected a JSON schema object")
        return v


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rid: str = Field(default_factory=lambda: uuid.uuid4().hex)
    input_ids: list[int] = Field(min_length=1)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = True
    stream: bool = False
    lora_path: str | None = None
    """The name of the loaded LoRA adapter that samples this request (SGLang's field for it);
    unset: the base model."""
    return_routed_experts: bool = False
    """A mixture-of-experts model's last chunk carries the experts each position was routed to
    (`meta_info.routed_experts`, `tracerl.routing`); a dense model returns none."""
    traceparent: SkipJsonSchema[str | None] = Field(default=None, exclude=True)
    """The caller's span (W3C `traceparent`), parent of the pool's generation span: in process
    only, never sent to an engine (excluded from dumps and from the engine's OpenAPI)."""

    @field_validator("rid")
    @classmethod
    def _rid_not_empty(cls, v: str) -> str:
        if not v:
            raise ValueError("must be a non-empty string")
        return v

    @classmethod
    def from_wire(cls, body: Any) -> GenerateRequest:
        """Validate a JSON body; raise `RequestError` naming the first bad field."""
        if not isinstance(body, dict):
            raise RequestError("body", "expected a JSON object")
        if body.get("sampling_params") is None:
            body = {**body, "sampling_params": {}}
        try:
            return cls.model_validate(body)
        except ValidationError as e:
            first = e.errors()[0]
            path = ".".join(str(p) for p in first["loc"]) or "body"
            raise RequestError(path, first["msg"]) from None


@dataclass
class GenerateOutput:
    """A finished generation, or (streaming) one chunk of new tokens."""

    rid: str
    output_ids: list[int]
    output_logprobs: list[float]
    prompt_tokens: int
    completion_tokens: int
    weight_version: int
    finish_reason: FinishType | None = None
    text: str = ""
    matched_stop: int | None = None
    weight_version_min: int | None = None
    """Oldest weights any token of this generation came from, when a resumed generation crossed
    a weight update (the pool sets it; `weight_version` is the newest)."""
    served_by: str | None = None
    """The pool member that generated this chunk (the pool sets it; never on the wire)."""
    attempts: int = 0
    """Attempts the pool has made for the request so far (the pool sets it; never on the wire)."""
    adapter: str | None = None
    """The LoRA adapter that sampled these tokens (the request's `lora_path`; None: the base
    model); `weight_version` is then that adapter's version."""
    routed_experts: np.ndarray | None = None
    """`[prompt + output, L, k]` (`tracerl.routing`), on the last chunk of a request that asked
    `return_routed_experts`, from a mixture-of-experts model."""

    def to_wire(self) -> dict[str, Any]:
        finish: dict[str, Any] | None = None
        if self.finish_reason is not None:
            finish = {"type": self.finish_reason}
            if self.matched_stop is not None:
                finish["matched"] = self.matched_stop
        return {
            "text": self.text,
            "output_ids": self.output_ids,
            "meta_info": {
                "id": self.rid,
                "finish_reason": finish,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "output_token_logprobs": [
                    [lp, tid, None]
                    for lp, tid in zip(self.output_logprobs, self.output_ids, strict=True)
                ],
                "weight_version": self.weight_version,
                **(
                    {"weight_version_min": self.weight_version_min}
                    if self.weight_version_min is not None
                    else {}
                ),
                **(
                    {"routed_experts": RoutedExperts.of(self.routed_experts).model_dump()}
                    if self.routed_experts is not None
                    else {}
                ),
            },
        }


@dataclass
class EngineStats:
    """Counters and gauges behind `/metrics` (rendered with vLLM's metric names)."""

    running: int = 0
    waiting: int = 0
    waiting_for_capacity: int = 0
    """Waiting requests the last admission refused for want of KV or a running slot (not
    arrivals since, nor anything while paused): what an overload looks like."""
    kv_used_tokens: int = 0
    kv_capacity_tokens: int = 0
    block_size: int = 1
    preemptions_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_cache_queries_total: int = 0
    """Prompt tokens looked up in the prefix cache."""
    prefix_cache_hits_total: int = 0
    """Of those, tokens the cache held (not prefilled again)."""
    finished_total: dict[str, int] = field(default_factory=dict)
    weight_version: int = 0
    paused: bool = False
    max_model_len: int = 0
