"""Continuous batching: which sequences run, which wait, and one model step over all of them.

Knows nothing of asyncio, threads or HTTP: the embedded engine calls it from its one scheduler
thread, and every result leaves through each sequence's `emit` callback. Each `step()`:
1. preempts the most recently admitted running sequences while the KV budget cannot hold one more
   token for each (they go back to the front of the queue and are recomputed later: the tokens
   they already sampled, and their log-probs, are kept);
2. admits waiting sequences while a slot is free and the budget has room for their prefix plus
   this step's decode writes;
3. runs one forward pass that decodes a token for every running sequence and prefills the
   admitted ones, samples every row, and releases finished sequences.

With a prefix cache (`engine.prefix_cache`, the slot-cache path only: `tracerl.engine.prefix_cache`)
a finished sequence's K/V is kept, and an admitted sequence that shares a prefix with a kept one
(the next turn of a multi-turn episode, another sample of a prompt) prefills only the tokens
after it. The cache lives in the KV budget the running sequences leave free. When the weights
change it is emptied, and a sequence that was running then is not kept: part of its K/V came
from the old weights.

Sequences therefore join and leave the batch at every step, and no compute is spent on padding or
on finished rows.

For a mixture-of-experts model the scheduler records, with `RoutingCapture`, which experts each
position was routed to (`tracerl.routing`): every forward's routers are read, each sequence
keeps the rows of its positions (the first computation of a position wins: a sequence
recomputed after preemption keeps the routing that sampled its tokens), cached prefixes keep
theirs, and a request that asked (`return_routed_experts`) gets its array in its last chunk.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tracerl.engine.admission import admissible, preemption_victims
from tracerl.engine.constraint import JsonConstraint
from tracerl.engine.forward import ModelRunner
from tracerl.engine.generic import GenericRunner
from tracerl.engine.prefix_cache import PrefixCache
from tracerl.engine.protocol import PAUSE_MODES, PauseMode
from tracerl.engine.sampling import RowSampling, sample
from tracerl.engine.types import FinishType, GenerateOutput, RequestError
from tracerl.routing import RoutingCapture, blank, unrecorded

# Prefill tokens folded into one step: enough to admit a burst of chat prompts at once, small
# enough that running requests do not stall for long behind a wave of new ones.
PREFILL_TOKENS_PER_STEP = 2048


@dataclass
class Sequence:
    rid: str
    prompt: list[int]
    max_new: int
    stop_ids: frozenset[int]
    sampling: RowSampling
    generator: torch.Generator
    emit: Callable[[Any], None]
    """Receives each `GenerateOutput` chunk, or the exception that ended the sequence."""
    constraint: JsonConstraint | None = None
    """What its output must match (`sampling_params.json_schema`); kept across preemption."""
    admit_order: int = -1
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    emitted: int = 0
    kv_len: int = 0
    finish: FinishType | None = None
    matched: int | None = None
    prompt_counted: bool = False
    cached: int = 0
    """Leading tokens its last admission found in the prefix cache (not prefilled again)."""
    weights_epoch: int = 0
    """The scheduler's count of weight changes when it was last admitted."""
    adapter: str | None = None
    """The LoRA adapter that samples it (`tracerl.engine.adapters`); None: the base."""
    return_routing: bool = False
    """Its last chunk carries the routed experts of its positions (a MoE model's)."""
    routing: np.ndarray | None = None
    """`[prompt + max_new, L, k]`: each position's routed experts once computed (a MoE model
    with capture on; `tracerl.routing`)."""

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.output)


@dataclass
class SchedulerCounters:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    prefix_queries: int = 0
    """Tokens of admitted sequences looked up in the prefix cache."""
    prefix_hits: int = 0
    """Of those, tokens found there (their prefill skipped)."""


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner | GenericRunner,
        kv_budget: int,
        max_model_len: int,
        prefix_cache: bool = False,
        capture: RoutingCapture | None = None,
    ) -> None:
        self.runner = runner
        self.capture = capture if capture is not None and capture.enabled else None
        """Records routed experts every forward (a MoE model, `engine.record_routed_experts`)."""
        self.prefix_cache: PrefixCache[Any] | None = (
            PrefixCache() if prefix_cache and isinstance(runner, ModelRunner) else None
        )
        self._weights_epoch = 0
        self._adapter_keys: dict[str, int] = {}
        self.kv_budget = kv_budget
        self.max_model_len = max_model_len
        self.device = runner.device
        self.weight_version = 0
        """The base weights' version: it labels what sequences without an adapter sample."""
        self.adapter_versions: dict[str, int] = {}
        """Each loaded adapter's version (the adapters requests may name): it labels what that
        adapter's sequences sample."""
        self.pause_mode: PauseMode | None = None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # index == KV slot
        self.counters = SchedulerCounters()
        self._admit_counter = itertools.count()

    def kv_used(self) -> int:
        return sum(s.kv_len for s in self.running)

    def step(self) -> bool:
        """Run one model step; False when there was nothing to do (idle or paused)."""
        if self.pause_mode is not None:
            return False
        self._make_room_for_decode()
        decoding = list(self.running)  # every running sequence has one token to feed
        admitted = self._admit()
        if not decoding and not admitted:
            if not self.waiting:
                self.runner.shrink()
            return False
        device = self.device
        tokens = torch.tensor([s.output[-1] for s in decoding], dtype=torch.long, device=device)
        positions = torch.tensor([s.kv_len for s in decoding], dtype=torch.long, device=device)
        prefills = [
            (len(decoding) + j, torch.tensor(s.tokens[s.cached :], device=device), s.cached)
            for j, s in enumerate(admitted)
        ]
        batch = decoding + admitted
        # adapters in the model: every step says which one each sequence takes
        adapters = [s.adapter for s in batch] if self.adapter_versions else None
        if self.capture is None:
            logits = self.runner.forward(tokens, positions, prefills, adapters)
        else:
            with self.capture.capture():
                logits = self.runner.forward(tokens, positions, prefills, adapters)
            self._record_routing(decoding, admitted, self.capture.take())
        for seq in decoding:
            seq.kv_len += 1
        for seq in admitted:
            seq.kv_len = len(seq.tokens)
        self._accept(batch, logits)
        self._evict()
        return True

    def _record_routing(
        self, decoding: list[Sequence], admitted: list[Sequence], rows: np.ndarray
    ) -> None:
        """Give each sequence the routing of the positions this forward computed (`rows`, the
        decode tokens then each prefill's): only to positions it has none for yet."""
        spans = [(s, s.kv_len, s.kv_len + 1) for s in decoding]
        spans += [(s, s.cached, len(s.tokens)) for s in admitted]
        offset = 0
        for seq, start, end in spans:
            self._write_routing(seq, start, rows[offset : offset + end - start])
            offset += end - start

    def _write_routing(self, seq: Sequence, start: int, rows: np.ndarray) -> None:
        if seq.routing is None:
            assert self.capture is not None and self.capture.layout is not None
            layers, top_k, dtype = self.capture.layout
            seq.routing = blank(len(seq.prompt) + seq.max_new, layers, top_k, dtype)
        span = seq.routing[start : start + rows.shape[0]]
        unset = unrecorded(span)
        span[unset] = rows[unset]

    def weights_changed(self) -> None:
        """Forget every cached prefix, and never keep a sequence running now: their K/V came
        (in part) from weights no longer served."""
        self._weights_epoch += 1
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def _evict(self) -> None:
        """Shrink the prefix cache into the KV the running sequences leave free, keeping room
        for each to write its next token."""
        if self.prefix_cache is not None:
            self.prefix_cache.evict(self.kv_budget - self.kv_used() - len(self.running))

    def _take_prefix(self, seq: Sequence, slot: int) -> None:
        """Load the longest cached prefix of `seq`'s tokens into `slot`, if there is one."""
        seq.cached = 0
        seq.weights_epoch = self._weights_epoch
        if self.prefix_cache is None:
            return
        tokens = seq.tokens
        key = self._cache_key(seq, tokens)
        found, saved = self.prefix_cache.take(key, share=True)
        found -= len(key) - len(tokens)  # an adapter's mark holds no K/V
        self.counters.prefix_queries += len(tokens)
        if saved is not None and found > 0:
            assert isinstance(self.runner, ModelRunner)
            kv, routing = saved
            self.runner.load_prefix(slot, kv, found)
            if routing is not None:
                self._write_routing(seq, 0, routing[:found])
            seq.cached = found
            self.counters.prefix_hits += found

    def _cache_key(self, seq: Sequence, tokens: list[int]) -> list[int]:
        """What the prefix cache knows `tokens` by: after a mark of `seq`'s adapter (a negative
        id no token has), since another adapter's K/V of the same tokens differ."""
        if seq.adapter is None:
            return tokens
        mark = self._adapter_keys.setdefault(seq.adapter, -1 - len(self._adapter_keys))
        return [mark, *tokens]

    def _keep_prefix(self, seq: Sequence) -> None:
        """Cache a sequence that finished normally under the weights it was admitted with: its
        tokens that have K/V (all but the last sampled one)."""
        if self.prefix_cache is None or seq.finish not in ("stop", "length"):
            return
        if seq.weights_epoch != self._weights_epoch:
            return  # admitted before the weights changed: part of its K/V is theirs
        assert isinstance(self.runner, ModelRunner)
        slot = self.running.index(seq)
        saved = self.runner.save_prefix(slot, seq.kv_len)
        routing = None if seq.routing is None else seq.routing[: seq.kv_len].copy()
        self.prefix_cache.put(self._cache_key(seq, seq.tokens[: seq.kv_len]), (saved, routing))

    def _admit(self) -> list[Sequence]:
        """Take waiting sequences into free slots while the KV budget holds their prefix plus
        one decode write for every running sequence, up to `PREFILL_TOKENS_PER_STEP` (the first
        one always fits, so a long prompt is never starved)."""
        admitted: list[Sequence] = []
        count = admissible(
            self.waiting,
            self.running,
            self.kv_budget,
            self.runner.max_slots,
            PREFILL_TOKENS_PER_STEP,
        )
        for _ in range(count):
            seq = self.waiting.popleft()
            self.running.append(seq)
            self._take_prefix(seq, len(self.running) - 1)
            seq.admit_order = next(self._admit_counter)
            if not seq.prompt_counted:
                seq.prompt_counted = True
                self.counters.prompt_tokens += len(seq.prompt)
            admitted.append(seq)
        self._evict()
        return admitted

    def _make_room_for_decode(self) -> None:
        for victim in preemption_victims(self.running, self.kv_budget):
            self._release(victim)
            victim.kv_len = 0
            self.waiting.appendleft(victim)
            self.counters.preemptions += 1

    def _accept(self, batch: list[Sequence], logits: torch.Tensor) -> None:
        vocab = logits.shape[-1]
        allowed = [s.constraint.allowed(vocab) if s.constraint else None for s in batch]
        tokens, logprobs = sample(
            logits, [s.sampling for s in batch], [s.generator for s in batch], allowed
        )
        for seq, token, logprob in zip(batch, tokens, logprobs, strict=True):
            seq.output.append(token)
            seq.logprobs.append(logprob)
            if seq.constraint is not None:
                seq.constraint.advance(token)
            if token in seq.stop_ids:
                seq.finish, seq.matched = "stop", token
            elif seq.constraint is not None and seq.constraint.complete:
                seq.finish = "stop"  # the value and its end are sampled (`ignore_eos` set)
            elif len(seq.output) >= seq.max_new or len(seq.tokens) >= self.max_model_len:
                seq.finish = "length"
        self.counters.generated_tokens += len(batch)
        for seq in batch:
            self._emit(seq)
            if seq.finish is not None:
                self._keep_prefix(seq)
                self._release(seq)

    def _emit(self, seq: Sequence) -> None:
        new_ids, new_lps = seq.output[seq.emitted :], seq.logprobs[seq.emitted :]
        seq.emitted = len(seq.output)
        seq.emit(
            GenerateOutput(
                rid=seq.rid,
                output_ids=new_ids,
                output_logprobs=new_lps,
                prompt_tokens=len(seq.prompt),
                completion_tokens=len(seq.output),
                weight_version=self.weight_version
                if seq.adapter is None
                else self.adapter_versions[seq.adapter],
                finish_reason=seq.finish,
                matched_stop=seq.matched,
                adapter=seq.adapter,
                routed_experts=self._routing_of(seq) if seq.finish is not None else None,
            )
        )
        if seq.finish is not None:
            finished = self.counters.finished
            finished[seq.finish] = finished.get(seq.finish, 0) + 1

    def _routing_of(self, seq: Sequence) -> np.ndarray | None:
        """The routing a finished sequence returns: a row per token (its last, never fed,
        unrecorded), or None when it did not ask or the model records none."""
        if not seq.return_routing or self.capture is None:
            return None
        if seq.routing is None:  # aborted before any forward
            assert self.capture.layout is not None
            return blank(seq.length, *self.capture.layout)
        return seq.routing[: seq.length].copy()

    def _release(self, seq: Sequence) -> None:
        """Free `seq`'s slot, moving the last running sequence into it to keep slots compact."""
        slot = self.running.index(seq)
        last = len(self.running) - 1
        if slot != last:
            moved = self.running[last]
            self.runner.move_slot(last, slot, moved.kv_len)
            self.running[slot] = moved
        self.running.pop()

    def abort(self, rids: set[str] | None) -> int:
        """Finish the named sequences (all when `rids` is None) with their partial output."""
        count = 0
        for seq in [*self.running, *self.waiting]:
            if rids is None or seq.rid in rids:
                seq.finish = "abort"
                self._emit(seq)
                if seq in self.running:
                    self._release(seq)
                else:
                    self.waiting.remove(seq)
                count += 1
        return count

    def pause(self, mode: PauseMode) -> None:
        if mode not in PAUSE_MODES:
            raise RequestError("mode", f"expected one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        if mode == "abort":
            self.abort(None)
        elif mode == "retract":
            for seq in sorted(self.running, key=lambda s: s.admit_order, reverse=True):
                self._release(seq)
                seq.kv_len = 0
                self.waiting.appendleft(seq)
        self.pause_mode = mode

    def resume(self) -> None:
        self.pause_mode = None

    def fail_running(self, error: BaseException) -> None:
        """After a failed step: the running sequences end with `error`; waiting ones stay."""
        for seq in self.running:
            seq.emit(error)
        self.running.clear()
