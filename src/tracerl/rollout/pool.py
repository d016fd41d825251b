"""The engine pool: N engines behind the `Engine` protocol, so that an engine that dies, hangs
or talks nonsense costs time, never a sample.

- Routing: a session's requests stay on one engine while it is active (prefix-cache locality);
  new sessions go to the active engine with the fewest requests in flight.
- Health: every engine's `/health` is polled; `failure_threshold` consecutive failures (polls or
  failed requests) take it out of rotation. Launched engines are restarted, brought to the
  current weights, checked with `/health_generate` and put back (under the weight-sync lock,
  so that no push passes a restarting engine by); external ones come back when they answer
  again. Every transition is logged and counted.
- Retries: a connection error, a timeout, a 5xx or an invalid reply is retried on another active
  engine, resuming from the tokens already generated (prompt + partial output as the new input,
  the remaining budget, ids and log-probs concatenated), up to `max_attempts`; 4xx replies are
  not retried. An engine abort (a weight sync) resumes the same way without counting a failure.
- Weight sync (full weights, or a LoRA adapter that embedded engines take alone): admission
  pauses; in-flight requests are aborted and resumed on the new weights, paused in place and
  continued on them (`update_mode = "in_place"`: no KV recomputed), or waited for; every
  active engine loads the weights and must report the new version; one that fails is taken out
  and restarted rather than left serving old weights. Bounded by a timeout.
  A launcher with `load_weights(path, version)` (a Ray actor) delivers weights to its engine
  itself (and LoRA adapters with `load_adapter`), for syncs and for a restarted engine alike.

One module of ~550 lines (its `engine.generate` spans are in `spans.py`, its members and how
one takes a weight push in `members.py`, a request's progress across attempts in
`progress.py`): routing, health checks, fail-over with resume,
restarts and weight sync all read and change the same members' state on one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

from tracerl.config import PoolConfig
from tracerl.engine.client import EngineClient, EngineHTTPError, EngineReplyError
from tracerl.engine.protocol import Engine, PauseMode, collect
from tracerl.engine.types import (
    GenerateOutput,
    GenerateRequest,
    PoolError,
)
from tracerl.rollout.launcher import STOP_GRACE_S, EngineLauncher
from tracerl.rollout.members import (
    RETRYABLE,
    Member,
    from_disk,
    load_adapter_files,
    load_member,
    serves_adapters,
    takes_in_process,
)
from tracerl.rollout.progress import Progress
from tracerl.rollout.spans import traced_generation
from tracerl.telemetry import INERT_SPAN, Span, Telemetry

if TYPE_CHECKING:
    from tracerl.engine.adapters import AdapterFiles, AdapterWeights

log = logging.getLogger(__name__)

AFFINITY_SESSIONS = 16384
"""Sessions whose engine the pool remembers, least recently used forgotten first: a forgotten
session is routed afresh (an engine's prefix cache holds far fewer sessions than this)."""


def affinity_key(rid: str) -> str:
    """Gateway request ids are `SESSION-REQUEST`; the session part is the affinity key."""
    return rid.split("-", 1)[0]


ClientFactory = Callable[[str], Engine]
"""The client for an engine server at a URL (`EngineClient`, or a backend's adapter)."""


class EnginePool:
    def __init__(
        self,
        members: list[Member],
        config: PoolConfig | None = None,
        client: ClientFactory | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        """`client`: how a restarted launched engine is reached (default `EngineClient`);
        `telemetry`: where `engine.generate` spans go (default: off)."""
        self.telemetry = telemetry or Telemetry()
        if not members:
            raise ValueError("an engine pool needs at least one engine")
        self.members = members
        self.config = config or PoolConfig()
        self.client = client or (lambda url: EngineClient(url, self.config.request_timeout_s))
        self._paused = False  # paused by this pool: health polls wait for the resume
        self.counters: Counter[str] = Counter()
        self.weight_version = 0
        self.weights_path: str | None = None
        self.adapter: str | None = None
        """The LoRA adapter the pool's engines were given (`update_weights(adapter=...)` or
        `adapter_files=`): it samples every request that names none."""
        self.adapter_files: AdapterFiles | None = None
        """Where the servers loaded it from: a restarted one loads it again."""
        self._affinity: OrderedDict[str, Member] = OrderedDict()
        self._admission = asyncio.Event()
        self._admission.set()
        self._changed = asyncio.Event()
        self._update_lock = asyncio.Lock()
        self._health_task: asyncio.Task[None] | None = None
        self.detection_s: list[float] = []  # last good contact -> taken out, per deactivation
        self._restarts: set[asyncio.Task[None]] = set()
        self._retired: list[Member] = []  # detached, closed with the pool

    @classmethod
    async def launch(
        cls,
        launchers: Sequence[EngineLauncher],
        externals: Sequence[str] = (),
        config: PoolConfig | None = None,
        client: ClientFactory | None = None,
        telemetry: Telemetry | None = None,
    ) -> EnginePool:
        """A pool of launched engines (started now) plus engines others run (by URL). If one
        fails to start, the others are stopped and the error is raised."""
        timeout = (config or PoolConfig()).request_timeout_s
        make = client or (lambda url: EngineClient(url, timeout))
        started = await asyncio.gather(
            *(launcher.start() for launcher in launchers), return_exceptions=True
        )
        failed = [r for r in started if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(*(launcher.stop() for launcher in launchers))
            raise failed[0]
        members = [
            Member(f"launched-{i}", make(str(url)), launcher)
            for i, (url, launcher) in enumerate(zip(started, launchers, strict=True))
        ]
        members += [Member(url, make(url)) for url in externals]
        return cls(members, config, make, telemetry)

    async def start(self) -> None:
        if self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop())

    async def close(self) -> None:
        tasks = [t for t in (self._health_task, *self._restarts) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._health_task = None
        for m in [*self.members, *self._retired]:
            if m.launcher is not None:
                await m.launcher.stop()
            if isinstance(m.engine, EngineClient):
                await m.engine.close()

    def attach(self, urls: Sequence[str]) -> None:
        """The engines others run are exactly `urls` from now on (a gateway following the
        pool that launches them, as it replaces engines): new ones join rotation, those no
        longer listed leave it (their requests in flight fail over as from a dead engine).
        Launched members are unaffected."""
        wanted = list(dict.fromkeys(urls))
        known = {m.name for m in self.members}
        keep = [m for m in self.members if m.launcher is not None or m.name in wanted]
        for member in self.members:
            if member not in keep:
                member.active = False
                self._retired.append(member)
                log.info("engine %s detached", member.name)
        self.members = keep + [Member(url, self.client(url)) for url in wanted if url not in known]
        self._changed.set()

    def engines(self) -> dict[str, Engine]:
        """The engines in rotation now, by member name (a restarted engine's new client)."""
        return {m.name: m.engine for m in self.members if m.active}

    # ------------------------------------------------------------------ routing

    def _mark(self, member: Member, ok: bool, reason: str = "") -> None:
        if ok:
            member.failures = 0
            member.last_ok = time.monotonic()
            return
        member.failures += 1
        if member.active and member.failures >= self.config.failure_threshold:
            member.active = False
            self.counters["deactivated"] += 1
            self.detection_s.append(time.monotonic() - member.last_ok)
            log.warning("engine %s taken out of rotation: %s", member.name, reason)
            self._changed.set()
            if member.launcher is not None and not member.restarting:
                task = asyncio.create_task(self._restart(member))
                self._restarts.add(task)
                task.add_done_callback(self._restarts.discard)

    def _take_out(self, member: Member, reason: str) -> None:
        """Out of rotation now (restarted if launched), whatever its failure count was."""
        member.failures = self.config.failure_threshold - 1
        self._mark(member, False, reason)

    async def _pick(self, key: str, exclude: set[str]) -> Member:
        deadline = time.monotonic() + self.config.no_engine_wait_s
        while True:
            sticky = self._affinity.get(key)
            if sticky is not None and sticky.active and sticky.name not in exclude:
                self._affinity.move_to_end(key)
                return sticky
            candidates = [m for m in self.members if m.active and m.name not in exclude]
            if not candidates:  # every other engine failed this request: allow a retry there
                candidates = [m for m in self.members if m.active]
            if candidates:
                chosen = min(candidates, key=lambda m: (m.inflight, _tiebreak(key, m.name)))
                self._affinity[key] = chosen
                self._affinity.move_to_end(key)
                if len(self._affinity) > AFFINITY_SESSIONS:
                    self._affinity.popitem(last=False)
                return chosen
            remaining = deadline - time.monotonic()
            if remaining <= 0 and self._restarting_until() > time.monotonic():
                remaining = 1.0  # an engine is restarting: its start-up bounds the wait
            if remaining <= 0:
                raise PoolError("no active engine (all failed health checks)")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, 1.0)):
                    await self._changed.wait()

    def _restarting_until(self) -> float:
        """When the latest restart in progress must have ended (its launcher's ready timeout
        after it began), or 0: requests wait for a restarting engine rather than fail."""
        return max((m.restart_deadline for m in self.members if m.restarting), default=0.0)

    # ------------------------------------------------------------------ generation

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        return await collect(self.generate_stream(request))

    def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        if not self.telemetry.enabled:
            return self._generate_stream(request, INERT_SPAN)
        return traced_generation(self.telemetry, request, self._generate_stream)

    async def _generate_stream(
        self, request: GenerateRequest, span: Span
    ) -> AsyncGenerator[GenerateOutput, None]:
        if self.adapter is not None and request.lora_path is None:  # the run's own adapter
            request = request.model_copy(update={"lora_path": self.adapter})
        key = affinity_key(request.rid)
        progress = Progress()
        failed_on: set[str] = set()
        reasons: list[str] = []
        budget = request.sampling_params.max_new_tokens
        attempts = aborts = 0
        while True:
            await self._admission.wait()
            remaining = None if budget is None else budget - len(progress.ids)
            if remaining is not None and remaining <= 0:
                yield progress.final(request, "length")
                return
            if attempts >= self.config.max_attempts:
                self.counters["exhausted"] += 1
                raise PoolError(
                    f"request {request.rid} failed on {attempts} attempts: " + "; ".join(reasons)
                )
            attempts += 1
            member = await self._pick(key, failed_on)
            span.update({"tracerl.engine.id": member.name, "tracerl.pool.attempts": attempts})
            attempt = progress.attempt(request, attempts, remaining)
            if progress.ids and request.sampling_params.json_schema is not None:
                self.counters["resumed_unconstrained"] += 1
                log.warning("request %s resumed without its JSON schema", request.rid)
            if attempts > 1:
                self.counters["resumes" if progress.ids else "retries"] += 1
                span.set("tracerl.pool.failed_on", ", ".join(sorted(failed_on)))
            finish = None
            member.inflight += 1
            try:
                async with contextlib.aclosing(member.engine.generate_stream(attempt)) as chunks:
                    while True:
                        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                        # cancellation racing a chunk, and a cancelled episode would run on
                        async with asyncio.timeout(self.config.request_timeout_s):
                            chunk = await anext(chunks, None)
                        if chunk is None:
                            raise EngineReplyError("stream ended without a finish reason")
                        if len(chunk.output_ids) != len(chunk.output_logprobs):
                            raise EngineReplyError("ids and logprobs of different lengths")
                        progress.add(chunk)
                        finish = chunk.finish_reason
                        if finish == "abort":  # resumed below; the abort is not the caller's
                            if not chunk.output_ids:
                                break
                            chunk.finish_reason = None  # its tokens are: passed on as sampled
                        chunk.rid = request.rid
                        chunk.served_by, chunk.attempts = member.name, attempts
                        chunk.adapter = attempt.lora_path
                        chunk.prompt_tokens = len(request.input_ids)
                        chunk.completion_tokens = len(progress.ids)
                        if chunk.finish_reason is not None:
                            chunk.routed_experts = progress.routing_for(request)
                        if progress.oldest is not None and progress.oldest != chunk.weight_version:
                            chunk.weight_version_min = progress.oldest
                        yield chunk
                        if finish is not None:
                            break
            except EngineHTTPError as e:
                if e.status < 500:
                    raise  # the request itself is wrong: another engine would say the same
                reasons.append(f"{member.name}: HTTP {e.status}")
                failed_on.add(member.name)
                self._mark(member, False, f"HTTP {e.status}")
                continue
            except RETRYABLE as e:
                reasons.append(f"{member.name}: {type(e).__name__}: {e}")
                failed_on.add(member.name)
                self._mark(member, False, f"{type(e).__name__}: {e}")
                continue
            finally:
                member.inflight -= 1
            self._mark(member, True)
            if finish == "abort":
                self.counters["aborted_resumed"] += 1
                aborts += 1
                span.set("tracerl.pool.aborts_resumed", aborts)
                attempts -= 1  # an abort (weight sync) is not a failed attempt
                continue
            return

    # ------------------------------------------------------------------ health

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._check(m) for m in self.members))
            await asyncio.sleep(self.config.health_interval_s)

    async def _check(self, member: Member) -> None:
        if member.restarting:
            return
        ok = member.launcher is None or member.launcher.alive()
        if ok and self._paused:
            return  # paused by this pool: a server may not answer until resumed (SGLang)
        if ok:
            try:
                async with asyncio.timeout(self.config.health_timeout_s):
                    ok = await member.engine.health()
            except (TimeoutError, aiohttp.ClientError, ConnectionError):
                ok = False
        if ok and not member.active and member.launcher is None:
            member.active, member.failures = True, 0
            self.counters["reactivated"] += 1
            log.info("engine %s answers again: back in rotation", member.name)
            self._changed.set()
            return
        self._mark(member, ok, "health check failed")

    async def _restart(self, member: Member) -> None:
        assert member.launcher is not None
        member.restarting = True
        ready_s = float(getattr(member.launcher, "ready_timeout_s", 0.0))
        member.restart_deadline = time.monotonic() + STOP_GRACE_S + ready_s
        try:
            if self._pushed_in_process_only(member):
                return
            while True:
                try:
                    await member.launcher.stop()
                    url = await member.launcher.start()
                    if isinstance(member.engine, EngineClient):
                        await member.engine.close()
                    member.engine = self.client(url)
                    # Under the sync lock: a push that lands while the engine loads would skip
                    # it (not active yet) and leave it serving the weights before that push.
                    async with self._update_lock:
                        if self._pushed_in_process_only(member):
                            await member.launcher.stop()
                            return
                        async with asyncio.timeout(self.config.update_timeout_s):
                            await self._bring_to_current_weights(member)
                        member.active, member.failures = True, 0
                    break
                except Exception as e:
                    log.warning("restarting engine %s failed (%s); trying again", member.name, e)
                    await asyncio.sleep(self.config.health_interval_s)
            member.last_ok = time.monotonic()
            self.counters["restarts"] += 1
            log.info("engine %s restarted at %s and back in rotation", member.name, url)
            self._changed.set()
        finally:
            member.restarting = False

    def _pushed_in_process_only(self, member: Member) -> bool:
        """Whether the current weights exist in no file a restarted engine could load (logged)."""
        if self.weight_version and self.weights_path is None and self.adapter_files is None:
            log.error(
                "engine %s cannot be restarted at v%d: those weights were pushed in "
                "process only; it stays out of rotation",
                member.name,
                self.weight_version,
            )
            return True
        return False

    async def _bring_to_current_weights(self, member: Member) -> None:
        """Load the pool's current weights into a restarted engine and check it generates."""
        if self.weights_path is not None:
            await from_disk(member, self.weights_path, self.weight_version)
        if self.adapter_files is not None:  # on the base it restarted with
            await load_adapter_files(member, self.adapter_files, self.weight_version)
        member.weight_version = self.weight_version
        if not await member.engine.health_generate():
            raise RuntimeError("health_generate failed")

    # ------------------------------------------------------------------ weight sync

    def adapter_names(self) -> set[str]:
        """The LoRA adapters requests may name: the pool's own and those its active engines
        report (what the gateway routes a request's `model` by)."""
        names = {self.adapter} if self.adapter is not None else set()
        for member in self.members:
            reported = getattr(member.engine, "adapter_names", None)
            if member.active and reported is not None:
                names |= reported()
        return names

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        """Bring every active engine to `weight_version` from a Hugging Face directory."""
        await self.update_weights(model_path, weight_version)

    async def update_weights(
        self,
        model_path: str | None,
        weight_version: int,
        named_tensors: Sequence[tuple[str, Any]] | None = None,
        adapter: AdapterWeights | None = None,
        adapter_files: AdapterFiles | None = None,
    ) -> None:
        """Bring every active engine to `weight_version`: embedded engines take `adapter` (a
        LoRA push: the adapters alone) or `named_tensors` in process when given, servers that
        load adapters take `adapter_files`, every other engine loads `model_path` (see the
        module docstring for the pause, abort/resume and failure handling)."""
        if model_path is None and any(
            not takes_in_process(m.engine, named_tensors, adapter)
            and not (adapter_files is not None and serves_adapters(m.engine))
            for m in self.members
        ):
            raise ValueError("model_path: required for engines outside this process")
        async with self._update_lock:
            self._admission.clear()
            try:
                async with asyncio.timeout(self.config.update_timeout_s):
                    await self._sync(
                        model_path, weight_version, named_tensors, adapter, adapter_files
                    )
                if adapter is not None:
                    self.adapter, self.adapter_files = adapter.name, None
                elif adapter_files is not None:
                    self.adapter, self.adapter_files = adapter_files.name, adapter_files
            finally:
                self._paused = False  # a failed sync must not leave health polls off
                self._admission.set()

    async def _sync(
        self,
        model_path: str | None,
        version: int,
        tensors: Sequence[tuple[str, Any]] | None,
        adapter: AdapterWeights | None,
        adapter_files: AdapterFiles | None = None,
    ) -> None:
        active = [m for m in self.members if m.active]
        mode = self.config.update_mode
        if mode == "wait":
            while any(m.inflight for m in self.members):
                await asyncio.sleep(0.01)
        else:  # one that cannot pause cannot load either: the load below takes it out
            pause: PauseMode = "abort" if mode == "abort_resume" else "in_place"
            self._paused = True
            await asyncio.gather(*(m.engine.pause(pause) for m in active), return_exceptions=True)
        results = await asyncio.gather(
            *(load_member(m, model_path, version, tensors, adapter, adapter_files) for m in active),
            return_exceptions=True,
        )
        self.weights_path, self.weight_version = model_path, version
        for member, result in zip(active, results, strict=True):
            if result is not None:  # the load's error, or one gather caught
                self.counters["update_failed"] += 1
                self._take_out(member, f"weight update to v{version} failed: {result}")
        if mode != "wait":
            await self._resume_active(f"resume after the v{version} update")

    # ------------------------------------------------------------------ Engine protocol rest

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        counts = await asyncio.gather(
            *(m.engine.abort(rid, abort_all=abort_all) for m in self.members if m.active),
            return_exceptions=True,
        )
        return sum(c for c in counts if isinstance(c, int))

    async def pause(self, mode: PauseMode = "in_place") -> None:
        """Pause every active engine; one that cannot be reached (it died since its last
        health check) is taken out and restarted instead of failing the caller's step."""
        self._paused = True
        active = [m for m in self.members if m.active]
        outcomes = await asyncio.gather(
            *(m.engine.pause(mode) for m in active), return_exceptions=True
        )
        self._take_out_failed(active, outcomes, "pause_failed", "pause")

    async def resume(self) -> None:
        """Resume every active engine, taking out (and restarting) one that fails to."""
        await self._resume_active("resume")

    async def _resume_active(self, what: str) -> None:
        """`what`: the step, as the log and the taken-out reason name it."""
        active = [m for m in self.members if m.active]
        try:
            outcomes = await asyncio.gather(
                *(m.engine.resume() for m in active), return_exceptions=True
            )
        finally:
            self._paused = False
        # paused for good, or gone: its requests would hang; they fail over instead
        self._take_out_failed(active, outcomes, "resume_failed", what)

    def _take_out_failed(
        self, members: list[Member], outcomes: list[Any], counter: str, what: str
    ) -> None:
        for member, outcome in zip(members, outcomes, strict=True):
            if isinstance(outcome, Exception):
                self.counters[counter] += 1
                self._take_out(member, f"{what} failed: {outcome!r}")

    async def health(self) -> bool:
        return any(m.active for m in self.members)

    async def health_generate(self) -> bool:
        checks = await asyncio.gather(
            *(m.engine.health_generate() for m in self.members if m.active), return_exceptions=True
        )
        return any(c is True for c in checks)

    async def model_info(self) -> dict[str, Any]:
        for m in self.members:
            if m.active:
                return await m.engine.model_info()
        raise PoolError("no active engine")

    async def metrics_text(self) -> str:
        texts = await asyncio.gather(
            *(m.engine.metrics_text() for m in self.members if m.active), return_exceptions=True
        )
        return "".join(t for t in texts if isinstance(t, str))


def _tiebreak(key: str, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{key}/{name}".encode()).digest()[:4], "big")
