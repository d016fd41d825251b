"""The simulated engine: the wire protocol and `/metrics` of a real engine, with no model.

It owns a timing and memory model and nothing else. KV capacity in tokens bounds what runs;
requests beyond it wait, and running requests that outgrow it are preempted (the newest first)
and recomputed later, counted like vLLM counts them. Finished sequences stay as an evictable
prefix cache in the free KV (least recently used evicted first): a request whose prompt extends
a cached sequence prefills only the rest, so agentic episodes pay for overload in recomputed
context. A step takes `decode_step_s` plus `decode_step_s_per_request` per running request, plus
prefill time for admitted prompts, all divided by `time_scale` (simulated seconds per second of
the event loop's clock). Time is read from the running loop, so under
`tracerl.bench.virtual_time` the engine runs on a virtual clock and Python overhead costs no
simulated time. Output lengths are lognormal around a median; ids, log-probs and lengths come
from per-request random streams seeded by the engine seed and the request's rid and seed, so a
run repeats exactly.

Fault injection (crash, hang, slowdown, malformed replies, 5xx, out-of-vocabulary ids) makes it
the test bed for the engine pool, the concurrency controller and the benchmarks.

One module of ~480 lines: the simulated engine is one object (scheduler, KV accounting, timing,
faults, metrics) that the pool, controller and loop tests drive as they would a real engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import random
import sys
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tracerl.config import SimEngineConfig
from tracerl.engine.admission import admissible, preemption_victims
from tracerl.engine.metrics import render_metrics
from tracerl.engine.prefix_cache import PrefixCache
from tracerl.engine.protocol import PAUSE_MODES, PauseMode, collect
from tracerl.engine.types import (
    EngineStats,
    FinishType,
    GenerateOutput,
    GenerateRequest,
    RequestError,
    SamplingParams,
    WeightLoadError,
)

# Exit code of a simulated crash, so a supervisor can tell it from a real failure.
CRASH_EXIT_CODE = 17
# Simulated time a weight update takes (the engine is paused meanwhile by its caller).
WEIGHT_UPDATE_S = 1.0


@dataclass
class _SimSequence:
    rid: str
    prompt_ids: list[int]
    prompt_len: int
    max_new: int
    target: int
    stop_ids: frozenset[int]
    rng: random.Random
    queue: asyncio.Queue[Any]
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    emitted: int = 0
    kv_len: int = 0
    admit_order: int = -1
    cached: int = 0
    prompt_counted: bool = False
    finish: FinishType | None = None

    @property
    def length(self) -> int:
        return self.prompt_len + len(self.output)


class SimEngine:
    """`Engine` protocol implementation that simulates an inference engine."""

    def __init__(self, config: SimEngineConfig, on_crash: Callable[[], None] | None = None) -> None:
        if config.embedding_size < config.vocab_size:
            raise RequestError("sim.embedding_size", "must be >= sim.vocab_size")
        self.config = config
        self.model_name = "sim"
        self.weight_version = 0
        self.on_crash = on_crash or (lambda: os._exit(CRASH_EXIT_CODE))
        self.requests_seen = 0
        self.hanging = False
        self.fault_rng = random.Random(config.seed ^ 0x5EED)
        self._waiting: deque[_SimSequence] = deque()
        self._running: list[_SimSequence] = []
        self._pause: PauseMode | None = None
        self._stats = EngineStats(
            kv_capacity_tokens=config.kv_cache_tokens, max_model_len=config.max_model_len
        )
        self._admit_counter = 0
        self._cache: PrefixCache[None] = PrefixCache()
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._clock: Callable[[], float] = time.monotonic
        self._started = self._clock()

    # ------------------------------------------------------------------ lifecycle

    def sim_time(self) -> float:
        """Simulated seconds since start."""
        return (self._clock() - self._started) * self.config.time_scale

    async def start(self) -> None:
        if self._tasks:
            return
        self._wake = asyncio.Event()
        # the loop's clock: wall time normally, simulated time under a virtual-time loop
        self._clock = asyncio.get_running_loop().time
        self._started = self._clock()
        self._tasks.append(asyncio.create_task(self._run()))
        faults = self.config.faults
        if faults.crash_at_s is not None:
            self._tasks.append(asyncio.create_task(self._at(faults.crash_at_s, self.on_crash)))
        if faults.hang_at_s is not None:
            self._tasks.append(asyncio.create_task(self._at(faults.hang_at_s, self._hang)))

    async def close(self) -> None:
        await self.abort(abort_all=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _at(self, sim_s: float, action: Callable[[], None]) -> None:
        await asyncio.sleep(max(0.0, sim_s - self.sim_time()) / self.config.time_scale)
        action()

    def _hang(self) -> None:
        self.hanging = True

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ requests

    def _prepare(self, request: GenerateRequest) -> _SimSequence:
        c = self.config
        ids = request.input_ids
        bad = next((i for i in ids if not 0 <= i < c.embedding_size), None)
        if bad is not None:
            raise RequestError(
                "input_ids", f"token id {bad} is outside the embedding [0, {c.embedding_size})"
            )
        room = min(c.max_model_len, c.kv_cache_tokens) - len(ids)
        if room < 1:
            raise RequestError("input_ids", f"prompt of {len(ids)} tokens leaves no room")
        sp = request.sampling_params
        if sp.max_new_tokens is not None and sp.max_new_tokens > room:
            raise RequestError(
                "sampling_params.max_new_tokens",
                f"{sp.max_new_tokens} + {len(ids)} prompt tokens exceed the context",
            )
        key = f"{c.seed}:{request.rid}:{sp.seed}".encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
        target = max(1, round(c.output_len_median * math.exp(c.output_len_sigma * rng.gauss(0, 1))))
        stops = set(sp.stop_token_ids) | (set() if sp.ignore_eos else {c.eos_token_id})
        return _SimSequence(
            rid=request.rid,
            prompt_ids=list(ids),
            prompt_len=len(ids),
            max_new=sp.max_new_tokens or room,
            target=target,
            stop_ids=frozenset(stops),
            rng=rng,
            queue=asyncio.Queue(),
        )

    async def generate_stream(
        self, request: GenerateRequest
    ) -> AsyncGenerator[GenerateOutput, None]:
        await self.start()
        seq = self._prepare(request)
        self._waiting.append(seq)
        self._publish()  # waiting, in the metrics, even while a pause keeps the loop idle
        self._poke()
        finished = False
        try:
            while not finished:
                chunk: GenerateOutput = await seq.queue.get()
                finished = chunk.finish_reason is not None
                yield chunk
        finally:
            if not finished:
                self._abort({seq.rid})

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        return await collect(self.generate_stream(request))

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        if not abort_all and rid is None:
            raise RequestError("rid", "give a rid or abort_all")
        return self._abort(None if abort_all else {rid or ""})

    def _abort(self, rids: set[str] | None) -> int:
        count = 0
        for seq in [*self._running, *self._waiting]:
            if rids is None or seq.rid in rids:
                seq.finish = "abort"
                self._emit(seq)
                if seq in self._running:
                    self._running.remove(seq)
                else:
                    self._waiting.remove(seq)
                count += 1
        self._publish()
        return count

    async def pause(self, mode: PauseMode = "in_place") -> None:
        if mode not in PAUSE_MODES:
            raise RequestError("mode", f"expected one of {', '.join(PAUSE_MODES)}")
        if mode == "abort":
            self._abort(None)
        elif mode == "retract":
            for seq in sorted(self._running, key=lambda s: s.admit_order, reverse=True):
                seq.kv_len = 0
                self._waiting.appendleft(seq)
            self._running.clear()
        self._pause = mode
        self._publish()

    async def resume(self) -> None:
        self._pause = None
        self._publish()
        self._poke()

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        if not Path(model_path).is_dir():
            raise WeightLoadError(f"model_path {model_path!r} is not a directory")
        await self.update_weights((), weight_version)

    async def update_weights(self, named_tensors: Any, weight_version: int) -> None:
        """An in-process weight push: takes the simulated load time, keeps no tensors."""
        if self.config.faults.fail_weight_updates:
            raise WeightLoadError("simulated failure to load weights")
        await asyncio.sleep(WEIGHT_UPDATE_S / self.config.time_scale)
        self.weight_version = weight_version
        self._cache.clear()  # K/V of the old weights serves no request after the update
        self._publish()

    async def health(self) -> bool:
        return True

    async def health_generate(self) -> bool:
        if self._pause is not None:
            return False
        probe = GenerateRequest(
            rid=f"health-{time.monotonic_ns()}",
            input_ids=[1],
            sampling_params=SamplingParams(max_new_tokens=1),
        )
        return len((await self.generate(probe)).output_ids) == 1

    async def model_info(self) -> dict[str, Any]:
        c = self.config
        return {
            "model_path": "sim",
            "is_generation": True,
            "max_model_len": c.max_model_len,
            "vocab_size": c.vocab_size,
            "embedding_size": c.embedding_size,
            "eos_token_ids": [c.eos_token_id],
            "weight_version": self.weight_version,
            "kv_cache_tokens": c.kv_cache_tokens,
            "paused": self._pause,
            "simulated": True,
        }

    def stats(self) -> EngineStats:
        snapshot = EngineStats(**vars(self._stats))
        snapshot.finished_total = dict(self._stats.finished_total)
        return snapshot

    async def metrics_text(self) -> str:
        return render_metrics(self.stats(), self.model_name)

    # ------------------------------------------------------------------ the simulated loop

    def _kv_used(self) -> int:
        return sum(s.kv_len for s in self._running)

    async def _run(self) -> None:
        assert self._wake is not None
        c = self.config
        while True:
            if self._pause is not None or not (self._running or self._waiting):
                self._wake.clear()
                await self._wake.wait()
                continue
            for victim in preemption_victims(self._running, c.kv_cache_tokens):
                self._running.remove(victim)
                victim.kv_len = 0
                self._waiting.appendleft(victim)
                self._stats.preemptions_total += 1
            admitted = self._admit()
            n = len(self._running)
            prefill = sum(s.length - s.cached for s in admitted)
            step_s = (
                c.decode_step_s + c.decode_step_s_per_request * n + c.prefill_s_per_token * prefill
            ) * c.faults.slowdown
            self._publish()
            await asyncio.sleep(step_s / c.time_scale)
            if self._pause == "in_place":
                continue  # paused mid-step: the step's tokens are not produced
            for seq in list(self._running):
                # as in the real scheduler: a prefix is cached on admission, then one token a step
                seq.kv_len = seq.length if seq in admitted else seq.kv_len + 1
                self._sample(seq)
                self._emit(seq)
                if seq.finish is not None:
                    self._running.remove(seq)
                    if c.prefix_cache:
                        self._cache.put(seq.prompt_ids + seq.output, None)
            self._evict()
            self._publish()

    def _admit(self) -> list[_SimSequence]:
        c = self.config
        admitted = []
        count = admissible(self._waiting, self._running, c.kv_cache_tokens, c.max_running_requests)
        for _ in range(count):
            seq = self._waiting.popleft()
            self._running.append(seq)
            self._admit_counter += 1
            seq.admit_order = self._admit_counter
            if not seq.prompt_counted:
                seq.prompt_counted = True
                self._stats.prompt_tokens_total += seq.prompt_len
            # a preempted sequence lost its blocks: only a first admission can hit the cache
            seq.cached = self._cache.take(seq.prompt_ids)[0] if not seq.output else 0
            if c.prefix_cache:
                self._stats.prefix_cache_queries_total += seq.prompt_len
                self._stats.prefix_cache_hits_total += seq.cached
            admitted.append(seq)
        self._evict()
        return admitted

    def _evict(self) -> None:
        """Least recently cached first, until the cache fits in the KV the running don't use."""
        self._cache.evict(self.config.kv_cache_tokens - self._kv_used() - len(self._running))

    def _sample(self, seq: _SimSequence) -> None:
        c = self.config
        produced = len(seq.output) + 1
        if produced >= seq.target:
            token = c.eos_token_id
        elif self.config.faults.oov_rate and seq.rng.random() < c.faults.oov_rate:
            token = seq.rng.randrange(c.vocab_size, c.embedding_size)
        else:
            token = seq.rng.randrange(c.vocab_size)
        seq.output.append(token)
        seq.logprobs.append(-seq.rng.expovariate(2.0))
        self._stats.generation_tokens_total += 1
        if token in seq.stop_ids:
            seq.finish = "stop"
        elif produced >= seq.max_new or seq.length >= c.max_model_len:
            seq.finish = "length"

    def _emit(self, seq: _SimSequence) -> None:
        new_ids, new_lps = seq.output[seq.emitted :], seq.logprobs[seq.emitted :]
        seq.emitted = len(seq.output)
        seq.queue.put_nowait(
            GenerateOutput(
                rid=seq.rid,
                output_ids=new_ids,
                output_logprobs=new_lps,
                prompt_tokens=seq.prompt_len,
                completion_tokens=len(seq.output),
                weight_version=self.weight_version,
                finish_reason=seq.finish,
                matched_stop=seq.output[-1] if seq.finish == "stop" else None,
            )
        )
        if seq.finish is not None:
            finished = self._stats.finished_total
            finished[seq.finish] = finished.get(seq.finish, 0) + 1

    def _publish(self) -> None:
        s = self._stats
        s.running = len(self._running)
        s.waiting = len(self._waiting)
        s.waiting_for_capacity = 0 if self._pause is not None else s.waiting
        s.kv_used_tokens = self._kv_used()
        s.weight_version = self.weight_version
        s.paused = self._pause is not None


def sim_engine_command(*settings: str, port: int = 0) -> list[str]:
    """The command of a `tracerl engine --sim` process, with `--sim.a.b=value` settings."""
    return [
        sys.executable,
        "-m",
        "tracerl.cli.main",
        "engine",
        "--sim",
        "--port",
        str(port),
        *settings,
    ]


def fault_middleware(engine: SimEngine) -> Any:
    """HTTP-level faults: crash, hang, 5xx and malformed `/generate` replies."""

    @web.middleware
    async def faults(request: web.Request, handler: Any) -> web.StreamResponse:
        f = engine.config.faults
        if engine.hanging:
            await asyncio.Event().wait()  # never answers: the caller's timeout decides
        if request.path == "/generate":
            engine.requests_seen += 1
            seen = engine.requests_seen
            if f.crash_after_requests is not None and seen > f.crash_after_requests:
                engine.on_crash()
            if f.hang_after_requests is not None and seen > f.hang_after_requests:
                engine.hanging = True
                await asyncio.Event().wait()
            draw = engine.fault_rng.random()
            if draw < f.error_rate:
                return web.json_response(
                    {"error": {"message": "simulated overload", "code": 503}}, status=503
                )
            if draw < f.error_rate + f.malformed_rate:
                if engine.fault_rng.random() < 0.5:
                    return web.Response(
                        text='{"meta_info": {"id": ', content_type="application/json"
                    )
                return web.json_response(
                    {
                        "text": "",
                        "output_ids": [1, 2],
                        "meta_info": {"finish_reason": {"type": "stop"}},
                    }
                )
        return await handler(request)

    return faults
