"""One generation for the gateway: prompt ids in, validated tokens, text and a finish reason out.

Drives an `Engine` stream, keeps the visible text current for streaming surfaces, applies stop
strings (the engine knows only stop token ids), and refuses replies it could not record:
a stream that ends without a finish reason, ids and log-probs of different lengths, or an empty
completion. Engine errors are classified for the caller's error shape: an engine's own non-2xx
reply (`UpstreamError`, passed through with its status), an unreachable engine
(`EngineUnavailable`, 503) and an untraceable reply (`UntraceableReply`, 500).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np

from tracerl.engine.client import EngineHTTPError, EngineReplyError
from tracerl.engine.detokenize import IncrementalDetokenizer, safe_decode
from tracerl.engine.protocol import Engine
from tracerl.engine.types import (
    EngineError,
    GenerateOutput,
    GenerateRequest,
    PoolError,
    RequestError,
    SamplingParams,
)
from tracerl.routing import fit


class UpstreamError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class EngineUnavailable(Exception):
    pass


class UntraceableReply(Exception):
    pass


@dataclass
class SamplingSpec:
    max_new_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    json_schema: str | None = None
    """The JSON schema the reply must match: a forced tool call's (the chat format's) or a
    structured-output request's."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Tokens that end the turn besides the engine's end-of-sequence ones (the chat format's)."""


@dataclass
class Progress:
    """A reply so far: its visible text, and its sampled ids and their log-probs (the
    generation's own growing lists: read them, never change them)."""

    text: str
    ids: list[int]
    logprobs: list[float]


@dataclass
class Completion:
    ids: list[int]
    logprobs: list[float]
    finish: Literal["stop", "length", "abort"]
    stop_sequence: str | None
    text: str
    """What the caller sees: special tokens skipped, cut before a matched stop string."""
    raw: str
    """The sampled text without a final end-of-turn token, as a template re-renders it."""
    full_text: str
    """All sampled ids decoded with special tokens: what follows the prompt text."""
    weight_version: int
    prompt_tokens: int
    weight_version_min: int | None = None
    adapter: str | None = None
    """The LoRA adapter that sampled it (None: the model's own weights)."""
    served_by: str | None = None
    """The pool member that generated it, and in how many attempts (None, 0: no pool)."""
    attempts: int = 0
    routed_experts: np.ndarray | None = None
    """`[prompt + ids, L, k]`: a mixture-of-experts model's routing (`tracerl.routing`)."""


async def generate(
    engine: Engine,
    tokenizer: Any,
    prompt_ids: list[int],
    spec: SamplingSpec,
    rid: str,
    eos_ids: set[int],
    stream: bool = True,
    traceparent: str | None = None,
    adapter: str | None = None,
    routing: bool = False,
) -> AsyncIterator[Progress | Completion]:
    """Yield the reply so far after each engine chunk, then the `Completion`. `traceparent`:
    the gateway request's span, parent of the pool's generation span; `adapter`: the LoRA
    adapter to sample with (None: the engine's default); `routing`: ask a mixture-of-experts
    engine for its routed experts.

    Without `stream` (and without stop strings, which need the text as it grows) the engine is
    asked for the whole reply at once, which costs one JSON reply instead of a stream of events.
    """
    # Built without re-validating thousands of ids the gateway's own tokenizer just produced.
    request = GenerateRequest.model_construct(
        rid=rid,
        input_ids=prompt_ids,
        return_logprob=True,
        stream=False,
        traceparent=traceparent,
        lora_path=adapter,
        return_routed_experts=routing,
        sampling_params=SamplingParams(
            max_new_tokens=spec.max_new_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=spec.top_k,
            seed=spec.seed,
            json_schema=spec.json_schema,
            stop_token_ids=spec.stop_token_ids,
        ),
    )
    ids: list[int] = []
    logprobs: list[float] = []
    finish: str | None = None
    version = 0
    min_version: int | None = None
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    incremental = stream or bool(spec.stop)  # otherwise the text is decoded once, at the end
    text = ""
    stop_hit: tuple[str, int] | None = None
    served_by, attempts = None, 0
    routed: np.ndarray | None = None
    try:
        chunks: AsyncGenerator[GenerateOutput, None] = (
            engine.generate_stream(request) if incremental else _one(engine.generate(request))
        )
        async with contextlib.aclosing(chunks) as engine_stream:
            async for chunk in engine_stream:
                if len(chunk.output_ids) != len(chunk.output_logprobs):
                    raise UntraceableReply("engine chunk has ids and logprobs of different lengths")
                ids += chunk.output_ids
                logprobs += chunk.output_logprobs
                version = chunk.weight_version
                if chunk.served_by is not None:  # the pool's word (its last chunk may lack it)
                    served_by, attempts = chunk.served_by, chunk.attempts
                if chunk.adapter is not None:
                    adapter = chunk.adapter
                if chunk.routed_experts is not None:
                    routed = chunk.routed_experts
                if chunk.weight_version_min is not None:
                    min_version = chunk.weight_version_min
                if incremental:
                    text += detok.add(chunk.output_ids)
                if chunk.finish_reason is not None:
                    finish = chunk.finish_reason
                    if incremental:
                        text += detok.flush()
                    else:
                        text = safe_decode(tokenizer, ids, skip_special_tokens=True)
                stop_hit = _find_stop(text, spec.stop)
                if stop_hit is not None:
                    break
                yield Progress(text, ids, logprobs)
                if finish is not None:
                    break
    except EngineHTTPError as e:
        raise UpstreamError(e.status, _error_message(e.body)) from None
    except EngineReplyError as e:
        raise UntraceableReply(str(e)) from None
    except RequestError as e:  # an in-process engine rejecting the request
        raise UpstreamError(400, str(e)) from None
    except EngineError as e:  # an in-process engine failing while generating
        raise UpstreamError(500, str(e)) from None
    except PoolError as e:  # every engine the pool tried failed
        raise UpstreamError(503, str(e)) from None
    except (aiohttp.ClientConnectionError, TimeoutError) as e:
        raise EngineUnavailable(f"engine unreachable: {e}") from None
    stop_sequence = None
    if stop_hit is not None:
        stop_sequence, cut = stop_hit
        keep = _tokens_covering(tokenizer, ids, cut + len(stop_sequence))
        ids, logprobs, text, finish = ids[:keep], logprobs[:keep], text[:cut], "stop"
        if routed is not None:  # a row per token kept, the last unrecorded
            routed = fit(routed[: len(prompt_ids) + keep - 1], len(prompt_ids) + keep)
        yield Progress(text, ids, logprobs)
    if finish not in ("stop", "length", "abort"):
        raise UntraceableReply("engine stream ended without a finish reason")
    if not ids and finish != "abort":
        raise UntraceableReply("engine returned an empty completion")
    raw_ids = ids[:-1] if ids and ids[-1] in eos_ids else ids
    yield Completion(
        ids=ids,
        logprobs=logprobs,
        finish=finish,  # type: ignore[arg-type]  # narrowed by the check above
        stop_sequence=stop_sequence,
        text=text,
        raw=safe_decode(tokenizer, raw_ids),
        full_text=safe_decode(tokenizer, ids),
        weight_version=version,
        prompt_tokens=len(prompt_ids),
        weight_version_min=min_version,
        adapter=adapter,
        served_by=served_by,
        attempts=attempts,
        routed_experts=routed,
    )


async def _one(reply: Awaitable[GenerateOutput]) -> AsyncGenerator[GenerateOutput, None]:
    yield await reply


def _find_stop(text: str, stops: list[str]) -> tuple[str, int] | None:
    best: tuple[str, int] | None = None
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and (best is None or at < best[1]):
            best = (stop, at)
    return best


def _tokens_covering(tokenizer: Any, ids: list[int], length: int) -> int:
    """The fewest leading ids whose visible text reaches `length` characters."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(safe_decode(tokenizer, ids[:mid], skip_special_tokens=True)) >= length:
            hi = mid
        else:
            lo = mid + 1
    return hi


def _error_message(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in body:
            return str(body["message"])
    return str(body)
