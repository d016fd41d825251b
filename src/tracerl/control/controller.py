"""The concurrency controller: how many episodes run at once, decided by measurement.

A pure state machine: no tasks, no clients, no clock of its own; every input carries `now`.

Policy. The cap is a feedforward token budget, `cap = clamp(kappa * C / G, min, max)`: C is the
decode engines' KV capacity in tokens, G the expected KV cost of one in-flight episode, and
kappa the over-commit factor the controller learns (episodes idle between turns, so the right
kappa is above 1 for agents and near 1 for single-turn work). G comes from bias-corrected EWMAs
of completed episodes' token counts per (environment, kind), blended by the eval share of the
pool, and floored by what the engines measure per running request: completion-based costs see
the fast episodes first and would undershoot after a raise.

Without a configured start, the cap bootstraps once from `C / max_model_len` (every episode at
worst case); engines that report no KV capacity start it at UNKNOWN_CAPACITY_START, and growth
then steps by GROWTH_SLEW alone (cuts still follow measured overload). The first
`frozen_steps` step boundaries pin it (only HARD cuts act), and at the end
of the freeze kappa is initialised by continuity so the feedforward starts at the current cap.

Each engine poll is classified over decode engines only, paused ones left out (a weight sync
queues what arrives and runs nothing: no evidence of load): HARD (preemptions since the last
poll, or requests the engines' admission refused for capacity above QUEUE_RATIO of running, with
something running, for QUEUE_PERSISTENCE_POLLS polls in a row), SOFT (KV usage at or above
KV_USAGE_SOFT), or CLEAR. Requests that merely arrived between two engine steps are not
capacity-queued: an engine slowed by training on the same cores queues them longer, and that
is a slower engine, not an overloaded one.
- A HARD poll cuts: the cap becomes BACKOFF_FACTOR x what the engines serve of what is in flight
  (in-flight scaled by running / (running + capacity-queued), so a start far above capacity
  lands near it in one cut instead of a cascade), with ESCALATED_BACKOFF_FACTOR when a swamped
  overload repeats within GRACE_POLLS polls of the last cut's drain, never above the current
  cap; kappa is re-derived from it, and the excess in flight is reported for shedding.
- After a cut a drain latch holds (no growth, no further cuts on stale churn) until in-flight is
  under the cap and a poll shows the engines settled. If, with in-flight already under the cap,
  the engines stay overloaded with a queue above DRAIN_QUEUE_RATIO of what runs for
  DRAIN_STALE_POLLS polls, the cut was not enough: the latch releases into an escalated cut (a
  latch that waits for calm forever pins an overloaded cap). Preemptions with a short queue are
  the backlog's long sequences still growing, which a lower cap does not fix sooner.
- Growth is re-evaluated once per REEVAL_TURNOVER of the pool (that share of the cap in
  completed episodes: fast at small caps, paced by the work itself at large ones). It happens
  only when the cap was binding during that turnover (in-flight, counting the completing
  episode, at the cap: completions in one burst see the pool already emptied), the last poll
  was CLEAR and fresh (younger than GROWTH_GATE_S: if metrics stop arriving, growth stops) with
  no request queued for capacity, and by at most GROWTH_SLEW of the cap. Failed episodes with
  no tokens used no engine capacity: they neither count toward the turnover nor make the cap
  binding.
  The feedforward with a grown kappa is the target, bounded by the measured token budget (the
  cap scaled by KV_USAGE_SOFT over the projected KV usage: the measured usage scaled up where
  running requests hold less than the pool's settled per-request KV, as episodes admitted by
  the last raise do until their contexts grow): growth approaches the band where the
  engines are full geometrically instead of overshooting into preemption between two polls, and
  kappa then follows the cap it produced. A growth clears escalation: an overload after a
  deliberate raise is a fresh probe, not the same overload surviving a cut. The cap only falls
  through cuts (the feedforward never lowers it by itself: measured overload decides that).

One module of ~450 lines: the controller is one pure state machine (states, estimates, the
decisions that read them); split, each half would be read only with the other.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tracerl.config import ConcurrencyConfig

log = logging.getLogger(__name__)

Signal = Literal["HARD", "SOFT", "CLEAR"]
Kind = Literal["train", "eval"]

# Cut to 90 % of what the engines serve (the served share already removes the queue): enough
# to stop preemptions without emptying the engines; a deeper cut costs throughput for a minute.
BACKOFF_FACTOR = 0.9
# A second overload right after a cut means the first was not enough: halve instead.
ESCALATED_BACKOFF_FACTOR = 0.5
# Polls without overload after a drain before the next cut is a fresh (unescalated) one.
GRACE_POLLS = 6
# HARD polls with in-flight already under the cap and requests still queueing for capacity after
# which the overload is not the engines' backlog clearing but the cut being too small: the latch
# releases and the next cut escalates.
DRAIN_STALE_POLLS = 3
# Queued requests above this share of running ones, with in-flight under the cap: the cap still
# admits far more than fits (a preemption's victims alone queue only a few per cent).
DRAIN_QUEUE_RATIO = 0.5
# Capacity-queued requests above this share of running ones count as queueing overload...
QUEUE_RATIO = 0.1
# ...only when it persists this many polls (turn-completion bursts queue briefly by nature).
QUEUE_PERSISTENCE_POLLS = 3
# KV usage at which growth stops and which the measured token budget fills to: a KV-bound
# engine's throughput is its running batch, so headroom below full is throughput lost; the
# occasional preemption above it is what the HARD cut handles (0.9/0.95 cost 3-6 % throughput
# on the heavy-tailed benchmark workload).
KV_USAGE_SOFT = 0.98
# The growth bound projects the KV usage the running requests will have once they hold the
# pool's settled per-request KV (an EWMA over SETTLED_COST_POLLS polls): right after a raise the
# newly admitted episodes are short and the current usage undercounts what they will hold.
SETTLED_COST_POLLS = 60
# kappa grows by this factor per binding, clear completion; the slew limit below usually binds
# first, so the feedforward matters when the expected episode cost moves.
KAPPA_GROWTH = 1.25
# Largest cap increase per re-evaluation, as a share of the cap (at least one episode). With a
# re-evaluation per fifth of the pool completing (REEVAL_TURNOVER), the ramp is at most 1.25x
# per fifth: ~3x (1.25^5) while a whole pool's worth of episodes completes. That is the
# intended speed: a start 10x too low reaches the engines' capacity in ~2 pool turnovers
# instead of ~10, and the measured token budget (KV filled to KV_USAGE_SOFT) bounds each
# raise, so the ramp slows as the engines fill and the next HARD cut interrupts an overshoot.
GROWTH_SLEW = 0.25
# Growth is re-evaluated after this share of the cap has completed: completions within one
# re-evaluation are one observation of the same pool, not independent evidence.
REEVAL_TURNOVER = 0.2
# A CLEAR poll older than this no longer licenses growth (metrics stalled: do not grow blind).
GROWTH_GATE_S = 15.0
# The first cap when the engines report no KV capacity (an SGLang or vLLM build without the
# metric): a moderate start that growth raises and HARD cuts lower, never a cap pinned at 1.
UNKNOWN_CAPACITY_START = 16
# Episodes of history in the cost EWMA: long enough to be stable, short enough to follow drift.
COST_HORIZON_EPISODES = 512
# kappa stays within these bounds: a cap of one on a huge pool is ~1e-4; above 16 it is fiction.
KAPPA_MIN, KAPPA_MAX = 1e-5, 16.0


@dataclass
class EngineLoad:
    """One engine's state at one poll (counters already turned into per-poll deltas)."""

    capacity_tokens: int
    max_model_len: int
    kv_usage: float
    running: int
    waiting: int
    waiting_for_capacity: int
    preemptions: int
    role: Literal["decode", "prefill", "mixed"] = "decode"
    paused: bool = False
    """Generation paused (a weight sync): the poll says nothing about load."""


@dataclass
class CostEstimate:
    """Bias-corrected EWMA: early values equal the plain mean instead of anchoring on the first."""

    alpha: float = 1.0 / COST_HORIZON_EPISODES
    weighted: float = 0.0
    weight: float = 0.0

    def add(self, value: float) -> None:
        self.weighted = (1 - self.alpha) * self.weighted + self.alpha * value
        self.weight = (1 - self.alpha) * self.weight + self.alpha

    @property
    def value(self) -> float | None:
        return self.weighted / self.weight if self.weight > 0 else None


@dataclass
class ControllerState:
    cap: int | None = None
    kappa: float | None = None
    steps: int = 0
    bootstrapped: bool = False
    draining: bool = False
    escalate: bool = False
    polls_since_drain: int = 0
    queue_polls: int = 0
    last_signal: Signal = "CLEAR"
    kv_usage: float = 0.0
    last_poll_at: float | None = None
    capacity: int = 0
    max_model_len: int = 0
    request_cost: float | None = None
    settled_request_cost: float | None = None
    """Slow EWMA of `request_cost`: what a running request holds once the pool has settled."""
    costs: dict[tuple[str, str], CostEstimate] = field(default_factory=dict)
    cuts: int = 0
    growths: int = 0
    turnover: int = 0
    bound: bool = False
    hard_under_cap: int = 0
    running: int = 0
    queued: int = 0
    """Requests the decode engines ran, and held queued for capacity, at the last poll."""

    def queue_above(self, ratio: float) -> bool:
        return self.queued > ratio * max(self.running, 1)

    @property
    def served_share(self) -> float:
        """The share of requests on the engines that they run rather than queue."""
        total = self.running + self.queued
        return self.running / total if total else 1.0


class ConcurrencyController:
    def __init__(
        self,
        config: ConcurrencyConfig,
        set_limit: Callable[[int], None],
        on_overload: Callable[[int], object] | None = None,
        get_inflight: Callable[[], int] = lambda: 0,
        get_eval_share: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.config = config
        self.set_limit = set_limit
        self.on_overload: Callable[[int], object] = on_overload or (lambda excess: None)
        self.get_inflight = get_inflight
        self.get_eval_share = get_eval_share
        self.state = ControllerState()
        if config.initial_inflight is not None:
            self._apply(config.initial_inflight, "concurrency.initial_inflight")

    # ------------------------------------------------------------------ inputs

    def observe(self, samples: list[EngineLoad], now: float) -> Signal:
        """One poll of every engine."""
        s = self.state
        # a paused engine (weight sync) runs nothing and queues what arrives: not overload
        decode = [x for x in samples if x.role != "prefill" and not x.paused]
        if not decode:
            return s.last_signal
        s.capacity = sum(x.capacity_tokens for x in decode)
        s.max_model_len = max(x.max_model_len for x in decode)
        s.running = sum(x.running for x in decode)
        s.queued = sum(x.waiting_for_capacity for x in decode)
        if s.running:
            used = sum(x.kv_usage * x.capacity_tokens for x in decode)
            s.request_cost = used / s.running
            alpha = 1.0 / SETTLED_COST_POLLS
            s.settled_request_cost = (
                s.request_cost
                if s.settled_request_cost is None
                else (1 - alpha) * s.settled_request_cost + alpha * s.request_cost
            )
        if s.last_poll_at is None:  # the capacity report, once
            log.info(
                "concurrency: %d decode engine(s), %d KV tokens in all, max model length %d",
                len(decode), s.capacity, s.max_model_len,
            )  # fmt: skip
        if s.cap is None and not s.bootstrapped:
            s.bootstrapped = True
            if s.capacity:
                self._apply(
                    max(1, s.capacity // max(1, s.max_model_len)),
                    f"bootstrap: {s.capacity} KV tokens / max model length {s.max_model_len}",
                )
            else:  # no capacity metric: probe from a moderate start instead of pinning 1
                self._apply(
                    UNKNOWN_CAPACITY_START,
                    "bootstrap: the engines report no KV capacity; growth probes from here",
                )
        signal = self._classify(decode)
        if signal != s.last_signal:
            log.info(
                "concurrency: %s -> %s (running %d, queued for capacity %d, KV %.0f%%, "
                "preemptions %d)", s.last_signal, signal, s.running, s.queued,
                100 * max(x.kv_usage for x in decode), sum(x.preemptions for x in decode),
            )  # fmt: skip
        s.last_signal, s.last_poll_at = signal, now
        s.kv_usage = max(x.kv_usage for x in decode)
        inflight = self.get_inflight()
        if s.draining:
            if inflight > (s.cap or 0):
                s.hard_under_cap = 0
                return signal  # the excess is still draining: overload now is stale churn
            if signal != "HARD":
                s.draining, s.polls_since_drain, s.hard_under_cap = False, 0, 0  # settled
                log.info("concurrency: drained to cap %s, engines %s", s.cap, signal)
                return signal
            # Preemptions (and their victims waiting) are the backlog's long sequences still
            # growing: keep waiting. A queue that is a large share of what runs means the
            # engines still get far more than fits under this cap.
            swamped = s.queue_above(DRAIN_QUEUE_RATIO)
            s.hard_under_cap = s.hard_under_cap + 1 if swamped else 0
            if s.hard_under_cap < DRAIN_STALE_POLLS:
                return signal
            s.draining, s.hard_under_cap = False, 0  # overload survived the drain: cut again
            log.info("concurrency: overload survived the drain at cap %s: cutting again", s.cap)
        if signal == "HARD":
            self._cut(inflight)
        else:
            s.polls_since_drain += 1
            if s.polls_since_drain >= GRACE_POLLS:
                s.escalate = False
        return signal

    def on_episode_complete(
        self, env: str, kind: Kind, tokens: int, duration_s: float, now: float
    ) -> None:
        """An episode finished (`get_inflight` no longer counts it)."""
        s = self.state
        if tokens > 0:
            s.costs.setdefault((env, kind), CostEstimate()).add(float(tokens))
        if tokens <= 0 or self._frozen() or s.draining or s.cap is None:
            return  # a failed episode used no engine capacity: it says nothing about load
        s.bound = s.bound or self.get_inflight() + 1 >= s.cap
        s.turnover += 1
        if s.turnover < max(1, math.ceil(REEVAL_TURNOVER * s.cap)):
            return
        bound, s.turnover, s.bound = s.bound, 0, False
        fresh = s.last_poll_at is not None and now - s.last_poll_at <= GROWTH_GATE_S
        # engines refusing admission for capacity (even below the HARD threshold) could not
        # run more episodes: no growth until they admit everything again
        if bound and fresh and s.last_signal == "CLEAR" and s.queued == 0:
            self._grow()

    def on_step(self) -> None:
        """A training step boundary."""
        s = self.state
        s.steps += 1
        if s.steps == self.config.frozen_steps and s.cap is not None:
            cost = self.expected_cost()
            if cost and s.capacity:
                s.kappa = _clamp_kappa(s.cap * cost / s.capacity)  # continuity at freeze exit

    # ------------------------------------------------------------------ policy

    def _frozen(self) -> bool:
        return self.state.steps < self.config.frozen_steps

    def _classify(self, decode: list[EngineLoad]) -> Signal:
        s = self.state
        if any(x.preemptions > 0 for x in decode):
            s.queue_polls = 0
            return "HARD"
        # a queue with nothing running is a stall (or a pause we missed), not too much work
        queueing = s.running > 0 and s.queue_above(QUEUE_RATIO)
        s.queue_polls = s.queue_polls + 1 if queueing else 0
        if s.queue_polls >= QUEUE_PERSISTENCE_POLLS:
            return "HARD"
        if max(x.kv_usage for x in decode) >= KV_USAGE_SOFT:
            return "SOFT"
        return "CLEAR"

    def _cut(self, inflight: int) -> None:
        s = self.state
        # Escalate only a swamped repeat: preemptions with a short queue are growth of the
        # resident sequences, which a halving overreacts to.
        swamped = s.queue_above(DRAIN_QUEUE_RATIO)
        escalated = s.escalate and swamped
        factor = ESCALATED_BACKOFF_FACTOR if escalated else BACKOFF_FACTOR
        current = s.cap if s.cap is not None else (self.config.max_inflight or inflight)
        # Back off from the share of in-flight the engines actually serve (requests queued for
        # capacity are episodes they cannot hold), in pool units: idle agents count in both.
        served = inflight * s.served_share
        target = min(current, max(self.config.min_inflight, math.floor(factor * served)))
        cause = "preemptions" if s.queue_polls == 0 else "a persistent queue for capacity"
        self._apply(  # a cut never raises the cap
            target,
            f"HARD ({cause}{', escalated' if escalated else ''}): {factor} x {served:.0f} "
            f"served of {inflight} in flight",
        )
        s.cuts += 1
        s.draining, s.escalate, s.queue_polls = True, True, 0
        s.turnover, s.bound = 0, False  # evidence from before the cut is stale
        cost = self.expected_cost()
        if cost and s.capacity and s.cap is not None:
            s.kappa = _clamp_kappa(s.cap * cost / s.capacity)
        if inflight > (s.cap or 0):
            self.on_overload(inflight - (s.cap or 0))

    def projected_usage(self) -> float:
        """The KV usage once the running requests hold the settled per-request KV: the
        current usage undercounts episodes admitted since, which have yet to grow."""
        s = self.state
        if not s.request_cost or not s.settled_request_cost:
            return s.kv_usage
        return s.kv_usage * max(1.0, s.settled_request_cost / s.request_cost)

    def _grow(self) -> None:
        s = self.state
        assert s.cap is not None
        cost = self.expected_cost()
        if not s.capacity:  # no KV capacity to budget against: grow by the slew, cut on HARD
            self._apply(
                s.cap + max(1, math.floor(GROWTH_SLEW * s.cap)),
                "growth: clear with the cap binding (engines report no KV capacity)",
            )
            s.growths += 1
            s.escalate = False
            return
        if not cost:
            return
        # The engines were clear with the cap binding: whatever the cost estimate did since the
        # last re-evaluation, the over-commit factor is at least the one the current cap implies.
        s.kappa = _clamp_kappa(max(s.kappa or 0.0, s.cap * cost / s.capacity))
        grown = _clamp_kappa(s.kappa * KAPPA_GROWTH)
        target = self._clamp(math.ceil(grown * s.capacity / cost))  # ceil: alive at cap 1
        usage = self.projected_usage()
        if usage > 0:
            # the measured token budget: the cap scaled to fill the engines to the SOFT band
            target = min(target, math.ceil(s.cap * KV_USAGE_SOFT / usage))
        if target <= s.cap:
            return
        step = max(1, math.floor(GROWTH_SLEW * s.cap))
        self._apply(
            min(target, s.cap + step),
            f"growth: clear with the cap binding (kappa {s.kappa:.2f}, KV {100 * s.kv_usage:.0f}% "
            f"now, {100 * usage:.0f}% projected, "
            f"episode cost {cost:.0f} tokens)",
        )
        s.kappa = _clamp_kappa(s.cap * cost / s.capacity)  # kappa follows the cap it produced
        s.growths += 1
        s.escalate = False  # an overload after a deliberate raise is a fresh probe, not a repeat

    def expected_cost(self) -> float | None:
        """G: tokens one in-flight episode holds, blended by kind, floored by engine reality."""
        s = self.state
        by_kind: dict[str, float] = {}
        for kind in ("train", "eval"):
            values = [c.value for (_, k), c in s.costs.items() if k == kind and c.value]
            if values:
                by_kind[kind] = sum(values) / len(values)
        eval_share = min(1.0, max(0.0, self.get_eval_share()))
        if by_kind:
            train = by_kind.get("train", by_kind.get("eval", 0.0))
            evals = by_kind.get("eval", train)
            cost: float | None = (1 - eval_share) * train + eval_share * evals
        else:
            cost = None
        if s.request_cost is not None:
            cost = max(cost or 0.0, s.request_cost)
        return cost

    def _clamp(self, value: int) -> int:
        ceiling = self.config.max_inflight
        return max(self.config.min_inflight, value if ceiling is None else min(ceiling, value))

    def _apply(self, cap: int, reason: str) -> None:
        cap = self._clamp(cap)
        if cap != self.state.cap:
            log.info("concurrency cap %s -> %d: %s", self.state.cap, cap, reason)
            self.state.cap = cap
            self.set_limit(cap)

    def state_dict(self) -> dict[str, object]:
        """What a resumed run needs to continue where this one stood (JSON-able)."""
        s = self.state
        return {
            "cap": s.cap,
            "kappa": s.kappa,
            "steps": s.steps,
            "bootstrapped": s.bootstrapped,
            "costs": [[env, kind, c.weighted, c.weight] for (env, kind), c in s.costs.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()`: the cap (applied through `set_limit`), kappa, the step
        count (so a finished freeze stays finished) and the cost estimates. Transient signal
        state (drain latch, escalation, polls) starts fresh: the engines restarted too."""
        s = self.state
        s.kappa = state.get("kappa")
        s.steps = int(state.get("steps", 0))
        s.bootstrapped = bool(state.get("bootstrapped", False))
        for env, kind, weighted, weight in state.get("costs", []):
            s.costs[(env, kind)] = CostEstimate(weighted=float(weighted), weight=float(weight))
        if state.get("cap") is not None:
            s.bootstrapped = True
            self._apply(int(state["cap"]), "resumed from the checkpoint")

    def gauges(self) -> dict[str, float]:
        s = self.state
        return {
            "concurrency/cap": float(s.cap or 0),
            "concurrency/kappa": float(s.kappa or 0.0),
            "concurrency/expected_cost": float(self.expected_cost() or 0.0),
            "concurrency/capacity": float(s.capacity),
            "concurrency/draining": float(s.draining),
            "concurrency/cuts": float(s.cuts),
            "concurrency/growths": float(s.growths),
            "concurrency/hard": float(s.last_signal == "HARD"),
        }


def _clamp_kappa(kappa: float) -> float:
    return max(KAPPA_MIN, min(KAPPA_MAX, kappa))
