"""The embedded engine: the `Engine` protocol over a `Scheduler`, in this process.

It owns the bridge between asyncio and the model and nothing about sessions or RL. One scheduler
thread runs the model; the asyncio side only submits sequences and commands and receives token
events, so the event loop (and the HTTP server on it) stays responsive while the model computes.
Commands (abort, pause, resume, weight updates) run on that thread at a step boundary, so they
never race a forward pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tracerl.config import EngineConfig
from tracerl.engine.adapters import (
    AdapterWeights,
    load_adapter,
    read_adapter_dir,
)
from tracerl.engine.constraint import ConstraintCompiler, JsonConstraint
from tracerl.engine.detokenize import IncrementalDetokenizer, safe_decode
from tracerl.engine.forward import make_runner
from tracerl.engine.metrics import render_metrics
from tracerl.engine.protocol import PauseMode, collect
from tracerl.engine.sampling import RowSampling
from tracerl.engine.scheduler import Scheduler, Sequence
from tracerl.engine.types import (
    EngineError,
    EngineStats,
    GenerateOutput,
    GenerateRequest,
    RequestError,
    SamplingParams,
)
from tracerl.engine.weights import copy_weights, read_weights_dir
from tracerl.models import eos_token_ids
from tracerl.routing import RoutingCapture

log = logging.getLogger(__name__)

# How long the idle scheduler sleeps between checks; new work wakes it at once.
IDLE_WAIT_S = 0.5
# A health probe that cannot produce one token in this time reports the engine unhealthy.
HEALTH_GENERATE_TIMEOUT_S = 60.0


@dataclass
class _Command:
    apply: Callable[[], Any]
    done: Callable[[Any, BaseException | None], None]


class LocalEngine:
    """Engine protocol implementation running a Hugging Face model in this process."""

    def __init__(self, config: EngineConfig, model: Any = None, tokenizer: Any = None) -> None:
        self.config = config
        if model is None or tokenizer is None:
            from tracerl.models import load_model_and_tokenizer

            device = config.device
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            dtype = {
                "float32": torch.float32,
                "bfloat16": torch.bfloat16,
                "float16": torch.float16,
            }.get(config.dtype)
            if dtype is None:
                dtype = torch.float32 if device == "cpu" else torch.bfloat16
            model, tokenizer = load_model_and_tokenizer(config.model, device, dtype)
        # Served where the model lives (a model handed in too), as its runner computes there:
        # the sampling generators must be on the same device.
        self.model, self.tokenizer = model, tokenizer
        self.device: torch.device = next(model.parameters()).device
        self.model_name = config.model
        native_len = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        self.max_model_len = config.max_model_len or native_len
        if native_len and self.max_model_len > native_len:
            raise RequestError(
                "engine.max_model_len",
                f"{self.max_model_len} exceeds the model's {native_len} positions",
            )
        self.runner = make_runner(
            model, config.max_running_requests, self.max_model_len, config.forward
        )
        self.embedding_size = int(model.get_input_embeddings().num_embeddings)
        self.eos_ids = _eos_ids(model, tokenizer)
        self._constraints = ConstraintCompiler(tokenizer, self.eos_ids)
        self.weight_version = 0
        self._seed_stream = torch.Generator().manual_seed(config.seed)
        # Shared with the asyncio side, guarded by `_cond`.
        self._cond = threading.Condition()
        self._inbox: list[Sequence] = []
        self._commands: list[_Command] = []
        self._stats = EngineStats(
            kv_capacity_tokens=config.kv_cache_tokens, max_model_len=self.max_model_len
        )
        self._stopping = False
        # Owned by the scheduler thread.
        capture = RoutingCapture(model) if config.record_routed_experts else None
        self.scheduler = Scheduler(
            self.runner, config.kv_cache_tokens, self.max_model_len, config.prefix_cache, capture
        )
        self._in_flight: set[str] = set()
        self._outbox: list[tuple[asyncio.Queue[Any], Any]] = []  # scheduler thread only
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="tracerl-engine", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        if self._thread is None:
            return
        await self.abort(abort_all=True)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    async def __aenter__(self) -> LocalEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---------------------------------------------------------------- requests

    def _prepare(
        self,
        request: GenerateRequest,
        emit: Callable[[Any], None],
        constraint: JsonConstraint | None = None,
    ) -> Sequence:
        ids = request.input_ids
        bad = next((i for i in ids if not 0 <= i < self.embedding_size), None)
        if bad is not None:
            raise RequestError(
                "input_ids", f"token id {bad} is outside the embedding [0, {self.embedding_size})"
            )
        room = min(self.max_model_len, self.config.kv_cache_tokens) - len(ids)
        if room < 1:
            raise RequestError(
                "input_ids",
                f"prompt of {len(ids)} tokens leaves no room for a completion in the context "
                f"({self.max_model_len} tokens) and KV budget ({self.config.kv_cache_tokens})",
            )
        loaded_adapters = self.scheduler.adapter_versions
        if request.lora_path is not None and request.lora_path not in loaded_adapters:
            loaded = ", ".join(sorted(loaded_adapters)) or "none"
            raise RequestError(
                "lora_path", f"no adapter {request.lora_path!r} is loaded (loaded: {loaded})"
            )
        sp = request.sampling_params
        if sp.max_new_tokens is not None and sp.max_new_tokens > room:
            raise RequestError(
                "sampling_params.max_new_tokens",
                f"{sp.max_new_tokens} + a prompt of {len(ids)} tokens exceeds the context "
                f"({self.max_model_len} tokens) or KV budget ({self.config.kv_cache_tokens})",
            )
        max_new = sp.max_new_tokens or min(room, self.config.default_max_new_tokens)
        seed = sp.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_stream))
        generator = torch.Generator(device=self.device).manual_seed(seed)
        stops = set(sp.stop_token_ids) | (set() if sp.ignore_eos else self.eos_ids)
        return Sequence(
            rid=request.rid,
            prompt=list(ids),
            max_new=max_new,
            stop_ids=frozenset(stops),
            sampling=RowSampling(sp.temperature, sp.top_p, sp.top_k),
            generator=generator,
            emit=emit,
            constraint=constraint,
            adapter=request.lora_path,
            return_routing=request.return_routed_experts,
        )

    def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        return self._chunks(request, detokenize=True)

    async def _chunks(
        self, request: GenerateRequest, detokenize: bool
    ) -> AsyncGenerator[GenerateOutput, None]:
        await self.start()
        assert self._loop is not None
        if request.rid in self._in_flight:
            raise RequestError("rid", f"a request with rid {request.rid!r} is already running")
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def emit(event: Any) -> None:  # on the scheduler thread; delivered after the step
            self._outbox.append((queue, event))

        schema = request.sampling_params.json_schema
        # off the event loop: the first schema builds the grammar's view of the vocabulary
        constraint = await asyncio.to_thread(self._constraints.compile, schema) if schema else None
        seq = self._prepare(request, emit, constraint)
        self._in_flight.add(seq.rid)
        detok = IncrementalDetokenizer(self.tokenizer)
        finished = False
        try:
            with self._cond:
                self._inbox.append(seq)
                self._cond.notify_all()
            while not finished:
                event = await queue.get()
                if isinstance(event, BaseException):
                    raise event
                chunk: GenerateOutput = event
                finished = chunk.finish_reason is not None
                if detokenize:
                    chunk.text = detok.add(chunk.output_ids) + (detok.flush() if finished else "")
                yield chunk
        finally:
            self._in_flight.discard(seq.rid)
            if not finished:  # the consumer went away: stop spending compute on it
                self._enqueue(_Command(lambda: self.scheduler.abort({seq.rid}), lambda *_: None))

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        out = await collect(self._chunks(request, detokenize=False))
        out.text = safe_decode(self.tokenizer, out.output_ids, skip_special_tokens=True)
        return out

    # ---------------------------------------------------------------- commands

    def _enqueue(self, command: _Command) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify_all()

    async def _call(self, apply: Callable[[], Any]) -> Any:
        """Run `apply` on the scheduler thread at the next step boundary; return its result."""
        await self.start()
        assert self._loop is not None
        loop = self._loop
        future: asyncio.Future[Any] = loop.create_future()

        def done(result: Any, error: BaseException | None) -> None:
            def settle() -> None:
                if future.done():
                    return
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)

            loop.call_soon_threadsafe(settle)

        self._enqueue(_Command(apply, done))
        return await future

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        if abort_all:
            return int(await self._call(lambda: self.scheduler.abort(None)))
        if rid is None:
            raise RequestError("rid", "give a rid or abort_all")
        return int(await self._call(lambda: self.scheduler.abort({rid})))

    async def pause(self, mode: PauseMode = "in_place") -> None:
        await self._call(lambda: self.scheduler.pause(mode))

    async def resume(self) -> None:
        await self._call(self.scheduler.resume)

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        path = Path(model_path)

        def apply() -> None:
            self._load_weights(read_weights_dir(path), weight_version)

        await self._call(apply)

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], weight_version: int
    ) -> None:
        """In-process weight update (no disk round trip), applied at a step boundary."""
        tensors = dict(named_tensors)
        await self._call(lambda: self._load_weights(tensors, weight_version))

    async def update_adapter(self, adapter: AdapterWeights, weight_version: int) -> None:
        """In-process LoRA adapter update (`tracerl.engine.adapters`): the base stays, the
        adapter is injected on its first push and copied in after; at a step boundary."""

        def apply() -> None:
            load_adapter(self.model, adapter.name, adapter.config, adapter.tensors)
            self.scheduler.weights_changed()  # cached K/V came from the old adapter
            # the adapter's tokens are labelled with its own version, the base's with theirs
            # (several runs' adapters on one engine each count their own steps)
            self.scheduler.adapter_versions[adapter.name] = weight_version
            self.weight_version = weight_version

        await self._call(apply)

    def adapter_names(self) -> set[str]:
        """The LoRA adapters a request may name (`lora_path`; the gateway's `model`)."""
        return set(self.scheduler.adapter_versions)

    async def load_lora_adapter(self, name: str, path: str, weight_version: int) -> None:
        """`update_adapter` from peft's adapter directory (what `/load_lora_adapter` serves)."""
        adapter = await asyncio.to_thread(read_adapter_dir, name, path)
        await self.update_adapter(adapter, weight_version)

    async def health(self) -> bool:
        return self._thread is None or self._thread.is_alive()

    async def health_generate(self) -> bool:
        if self.scheduler.pause_mode is not None:
            return False
        probe = GenerateRequest(
            rid=f"health-{time.monotonic_ns()}",
            input_ids=[self.eos_ids_sorted()[0]],
            sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True),
        )
        try:
            async with asyncio.timeout(HEALTH_GENERATE_TIMEOUT_S):
                out = await self.generate(probe)
        except (TimeoutError, EngineError):
            return False
        return len(out.output_ids) == 1

    def eos_ids_sorted(self) -> list[int]:
        return sorted(self.eos_ids) or [0]

    async def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_name,
            "is_generation": True,
            "max_model_len": self.max_model_len,
            "vocab_size": len(self.tokenizer),
            "embedding_size": self.embedding_size,
            "eos_token_ids": self.eos_ids_sorted(),
            "weight_version": self.weight_version,
            "adapters": dict(self.scheduler.adapter_versions),
            "kv_cache_tokens": self.config.kv_cache_tokens,
            "max_running_requests": self.config.max_running_requests,
            "device": str(self.device),
            "dtype": str(self.runner.dtype).removeprefix("torch."),
            "paused": self.scheduler.pause_mode,
        }

    def stats(self) -> EngineStats:
        with self._cond:
            snapshot = EngineStats(**vars(self._stats))
            snapshot.finished_total = dict(self._stats.finished_total)
            return snapshot

    async def metrics_text(self) -> str:
        return render_metrics(self.stats(), self.model_name)

    # ---------------------------------------------------------------- scheduler thread

    def _run(self) -> None:
        while True:
            with self._cond:
                commands, self._commands = self._commands, []
                self.scheduler.waiting.extend(self._inbox)
                self._inbox = []
                if self._stopping and not commands:
                    return
            outcomes: list[tuple[Any, BaseException | None]] = []
            for command in commands:
                try:
                    outcomes.append((command.apply(), None))
                except BaseException as e:  # reported to the caller, never swallowed
                    outcomes.append((None, e))
            if commands:
                self._publish_stats()  # callers see the state their command produced
                self._deliver()
            for command, (result, error) in zip(commands, outcomes, strict=True):
                command.done(result, error)
            try:
                progressed = self.scheduler.step()
            except Exception as e:
                log.exception("engine step failed; failing the running requests")
                self.scheduler.fail_running(EngineError(f"engine step failed: {e!r}"))
                progressed = True
            self._publish_stats()
            self._deliver()
            if not progressed:
                with self._cond:
                    if not (self._commands or self._inbox or self._stopping):
                        self._cond.wait(IDLE_WAIT_S)

    def _deliver(self) -> None:
        """Hand this step's token events to the event loop in one call, after the stats were
        published, so a caller that has its result also sees it in `stats()` and `/metrics`."""
        if not self._outbox or self._loop is None:
            return
        batch, self._outbox = self._outbox, []

        def put_all() -> None:
            for queue, event in batch:
                queue.put_nowait(event)

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
            self._loop.call_soon_threadsafe(put_all)

    def _load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        copy_weights(self.model, tensors)
        self.scheduler.weights_changed()  # cached K/V came from the old weights
        self.weight_version = self.scheduler.weight_version = version

    def _publish_stats(self) -> None:
        sched = self.scheduler
        with self._cond:
            s = self._stats
            s.running = len(sched.running)
            s.waiting = len(sched.waiting) + len(self._inbox)
            # after a step, what is still waiting was refused by admission; paused, none was
            s.waiting_for_capacity = 0 if sched.pause_mode is not None else len(sched.waiting)
            s.kv_used_tokens = sched.kv_used()
            s.preemptions_total = sched.counters.preemptions
            s.prompt_tokens_total = sched.counters.prompt_tokens
            s.generation_tokens_total = sched.counters.generated_tokens
            s.prefix_cache_queries_total = sched.counters.prefix_queries
            s.prefix_cache_hits_total = sched.counters.prefix_hits
            s.finished_total = dict(sched.counters.finished)
            s.weight_version = self.weight_version
            s.paused = sched.pause_mode is not None


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    gen = getattr(model, "generation_config", None)
    return eos_token_ids(getattr(gen, "eos_token_id", None), tokenizer)
