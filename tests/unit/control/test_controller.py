"""The controller's transitions, driven by scripted samples and completions. Each bug the seed
records (bootstrap flapping, freeze off-by-one, escalation latching, growth dead at small caps,
cuts raising the cap) has its test here."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tracerl.config import ConcurrencyConfig
from tracerl.control import controller as c
from tracerl.control.controller import ConcurrencyController, EngineLoad


class Harness:
    def __init__(self, **config: Any) -> None:
        self.inflight = 0
        self.eval_share = 0.0
        self.limits: list[int] = []
        self.overloads: list[int] = []
        self.ctl = ConcurrencyController(
            ConcurrencyConfig(**config),
            set_limit=self.limits.append,
            on_overload=self.overloads.append,
            get_inflight=lambda: self.inflight,
            get_eval_share=lambda: self.eval_share,
        )
        self.now = 0.0

    @property
    def cap(self) -> int | None:
        return self.ctl.state.cap

    def poll(
        self,
        preemptions: int = 0,
        usage: float = 0.3,
        running: int = 10,
        queued: int = 0,
        capacity: int = 100_000,
        max_len: int = 4096,
        role: str = "decode",
        paused: bool = False,
        arrived: int = 0,
    ) -> str:
        """`queued`: refused by admission (capacity); `arrived`: waiting, not yet considered."""
        self.now += 5.0
        load = EngineLoad(
            capacity, max_len, usage, running, queued + arrived, queued, preemptions,
            role, paused,  # type: ignore[arg-type]
        )  # fmt: skip
        return self.ctl.observe([load], self.now)

    def complete(self, tokens: int = 2000, kind: str = "train", env: str = "e") -> None:
        self.ctl.on_episode_complete(env, kind, tokens, 1.0, self.now)  # type: ignore[arg-type]

    def turnover(self, binding: bool = True) -> None:
        """One re-evaluation's worth of completions, all at once like a burst from one engine
        step: only the first sees the pool at the cap, the rest see it emptied by the first."""
        assert self.cap is not None
        count = max(1, math.ceil(c.REEVAL_TURNOVER * self.cap))
        start = self.cap - 1 if binding else self.cap // 2
        for i in range(count):
            self.inflight = start - i
            self.complete()


def test_bootstrap_happens_once_from_capacity_over_max_len() -> None:
    h = Harness(frozen_steps=0)
    h.poll(capacity=100_000, max_len=4096)
    assert h.cap == 24  # 100000 // 4096
    h.poll(capacity=400_000, max_len=4096)  # more capacity later: no second bootstrap (no flap)
    assert h.cap == 24 and h.limits == [24]


def test_configured_start_is_used_and_bounds_hold() -> None:
    h = Harness(initial_inflight=50, min_inflight=4, max_inflight=60)
    assert h.cap == 50 and h.limits == [50]
    h.poll(capacity=10**9, max_len=10)
    assert h.cap == 50  # no bootstrap over a configured start


def test_no_ceiling_lets_the_cap_grow_past_the_default_ceiling() -> None:
    h = Harness(initial_inflight=1000, max_inflight=None, frozen_steps=0)
    capped = Harness(initial_inflight=1000, frozen_steps=0)  # max_inflight 1024 by default
    for harness in (h, capped):
        harness.poll(capacity=10**9, max_len=10, running=1000, usage=0.1)
        harness.turnover()
    assert h.cap == 1250 and capped.cap == 1024  # one 25 % raise, clamped only when capped
    h.inflight = 1250
    h.poll(preemptions=2, capacity=10**9, max_len=10, running=1000, usage=0.1)
    assert h.cap == 1125  # a cut still applies (0.9 x 1250)
    with pytest.raises(ValueError, match="min_inflight"):
        ConcurrencyConfig(min_inflight=5, max_inflight=4)
    assert ConcurrencyConfig(min_inflight=5000, max_inflight=None).max_inflight is None


def test_every_cap_change_is_logged_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="tracerl.control.controller")
    h = Harness(frozen_steps=0)
    h.poll(capacity=100_000, max_len=4096)  # the capacity report, and the bootstrap
    h.turnover()  # growth
    h.inflight = h.cap or 0
    h.poll(preemptions=3)  # a HARD cut
    text = caplog.text
    assert "1 decode engine(s), 100000 KV tokens in all, max model length 4096" in text
    assert "cap None -> 24: bootstrap: 100000 KV tokens / max model length 4096" in text
    assert "cap 24 -> 30: growth: clear with the cap binding" in text
    assert "CLEAR -> HARD" in text
    assert "cap 30 -> 27: HARD (preemptions): 0.9 x 30 served of 30 in flight" in text


def test_freeze_pins_exactly_the_first_k_steps_but_not_hard_cuts() -> None:
    h = Harness(initial_inflight=20, frozen_steps=1)
    h.poll()
    h.turnover()
    assert h.cap == 20  # frozen: no growth before the first step boundary
    h.ctl.on_step()
    h.poll()
    h.turnover()
    assert h.cap == 25  # k=1 froze exactly one step: growth now (slew 25 % of 20)
    frozen = Harness(initial_inflight=20, frozen_steps=3)
    frozen.inflight = 20
    frozen.poll(preemptions=2)
    assert frozen.cap == 18  # HARD cuts stay live inside the freeze (0.9 x 20)


def test_growth_only_when_binding_and_clear() -> None:
    h = Harness(initial_inflight=20, frozen_steps=0)
    h.poll()
    h.turnover(binding=False)  # far below the cap the whole turnover
    assert h.cap == 20
    h.turnover()  # one completion in the burst saw 19 + itself == cap: binding
    assert h.cap == 25
    h.poll(usage=0.99)  # SOFT band: no growth
    h.turnover()
    assert h.cap == 25
    # requests refused for capacity, below the HARD threshold (one poll): still no growth
    assert h.poll(running=20, queued=1) == "CLEAR"
    h.turnover()
    assert h.cap == 25
    h.poll()  # admitted again
    h.turnover()
    assert h.cap == 31


def test_growth_is_reevaluated_once_per_turnover() -> None:
    h = Harness(initial_inflight=40, frozen_steps=0)
    h.poll()
    per_turnover = math.ceil(c.REEVAL_TURNOVER * 40)
    for _ in range(per_turnover - 1):
        h.inflight = 39
        h.complete()
    assert h.cap == 40  # the turnover is not complete: completions are one observation
    h.inflight = 10
    h.complete()
    assert h.cap == 50  # the binding completion earlier in the turnover counts


def test_growth_is_slew_limited_and_alive_at_small_caps() -> None:
    h = Harness(initial_inflight=1, frozen_steps=0)
    h.poll()
    caps = []
    for _ in range(5):
        h.turnover()
        caps.append(h.cap)
    assert caps == [2, 3, 4, 5, 6]  # at least one per re-evaluation, never a jump
    big = Harness(initial_inflight=100, frozen_steps=0)
    big.poll()
    big.turnover()
    assert big.cap == 125  # at most 25 % per re-evaluation


def test_growth_is_bounded_by_the_measured_token_budget() -> None:
    h = Harness(initial_inflight=100, frozen_steps=0)
    h.poll(usage=0.8, running=100)
    h.turnover()
    # 100 episodes fill 80 % of the KV: the SOFT band holds 100 x 0.98 / 0.8 = 123, not 125
    assert h.cap == math.ceil(100 * c.KV_USAGE_SOFT / 0.8)


def test_growth_bound_counts_what_young_episodes_will_hold() -> None:
    """Right after a raise the new episodes are short: the usage they show undercounts what
    they will hold. The bound projects the usage at the pool's settled per-request KV."""
    h = Harness(initial_inflight=100, frozen_steps=0)
    for _ in range(3 * c.SETTLED_COST_POLLS):
        h.poll(usage=0.8, running=100)  # settled: 800 KV tokens per running request
    h.poll(usage=0.7, running=100)  # a fifth of the requests just started: 700 on average
    settled = h.ctl.state.settled_request_cost
    assert settled is not None and 790 < settled < 800
    projected = h.ctl.projected_usage()
    assert projected == pytest.approx(0.7 * settled / 700)
    h.turnover()
    # the current usage alone would allow 100 x 0.98 / 0.7 = 140, slew-limited to 125
    assert h.cap == math.ceil(100 * c.KV_USAGE_SOFT / projected) < 125
    # requests larger than the settled size never lower the projection below the usage
    h.poll(usage=0.9, running=100)
    assert h.ctl.projected_usage() == pytest.approx(0.9)


def test_growth_gate_expires_when_metrics_stop() -> None:
    h = Harness(initial_inflight=20, frozen_steps=0)
    h.poll()
    h.now += c.GROWTH_GATE_S + 1  # no poll since
    h.turnover()
    assert h.cap == 20


def test_failed_episodes_never_grow_the_cap() -> None:
    h = Harness(initial_inflight=20, frozen_steps=0)
    h.poll()
    for _ in range(20):
        h.inflight = 19
        h.complete(tokens=0)
    assert h.cap == 20 and not h.ctl.state.costs
    assert h.ctl.state.turnover == 0  # not even counted toward a re-evaluation


def test_preemption_cuts_from_inflight_and_sheds_the_excess() -> None:
    h = Harness(initial_inflight=100, frozen_steps=0)
    h.inflight = 90
    assert h.poll(preemptions=3) == "HARD"
    assert h.cap == 81  # 0.9 x 90
    assert h.overloads == [9]
    assert h.ctl.state.draining


def test_a_cut_never_raises_the_cap() -> None:
    h = Harness(initial_inflight=50, frozen_steps=0)
    h.inflight = 200  # work the dispatcher over-admitted before the cap fell
    h.poll(preemptions=1)
    assert h.cap == 50 and h.limits == [50]


def test_persistent_queueing_is_hard_but_one_burst_is_not() -> None:
    h = Harness(initial_inflight=40, frozen_steps=0)
    h.inflight = 40
    assert h.poll(running=20, queued=10) == "CLEAR"  # one burst
    assert h.poll(running=20, queued=0) == "CLEAR"
    assert [h.poll(running=20, queued=10) for _ in range(c.QUEUE_PERSISTENCE_POLLS)] == [
        "CLEAR"
    ] * (c.QUEUE_PERSISTENCE_POLLS - 1) + ["HARD"]
    assert h.cap == 24  # 0.9 x the 2/3 of 40 in flight the engines serve


def test_drain_latch_holds_until_under_cap_and_settled() -> None:
    h = Harness(initial_inflight=100, frozen_steps=0)
    h.inflight = 100
    h.poll(preemptions=5)
    assert h.cap == 90 and h.ctl.state.draining
    h.inflight = 95
    h.poll(preemptions=5)  # stale churn while draining: no second cut
    assert h.cap == 90 and h.ctl.state.draining
    h.inflight = 89
    h.poll(preemptions=1)  # under the cap but the engines' backlog still preempts
    assert h.ctl.state.draining and h.cap == 90
    h.poll()
    assert not h.ctl.state.draining
    h.turnover()
    assert h.cap > 90  # growth resumes after the latch


def test_overload_surviving_the_drain_releases_into_an_escalated_cut() -> None:
    h = Harness(initial_inflight=100, frozen_steps=0)
    h.inflight = 100
    h.poll(preemptions=5)
    assert h.cap == 90
    h.inflight = 88
    for _ in range(2 * c.DRAIN_STALE_POLLS):
        h.poll(preemptions=2, queued=2)  # the backlog's long sequences still grow: wait
        assert h.cap == 90 and h.ctl.state.draining
    # under the cap, yet the engines keep preempting and queue as much as they run: too small
    for _ in range(c.DRAIN_STALE_POLLS - 1):
        h.poll(preemptions=2, queued=10)
        assert h.cap == 90 and h.ctl.state.draining
    h.poll(preemptions=2, queued=10)
    assert h.cap == 22  # escalated: 0.5 x the half of 88 the engines serve; latched again
    assert h.ctl.state.draining


def test_escalation_and_its_reset_after_grace() -> None:
    h = Harness(initial_inflight=100, frozen_steps=0)
    h.inflight = 100
    h.poll(preemptions=1)
    assert h.cap == 90
    h.inflight = 90
    h.poll()  # drained
    h.poll(preemptions=1, running=40, queued=40)  # swamped again right away: escalated
    assert h.cap == 22  # 0.5 x the 45 of 90 in flight the engines serve
    h.inflight = 22
    h.poll()  # drained
    for _ in range(c.GRACE_POLLS):
        h.poll()
    h.poll(preemptions=1)  # after the grace window: a fresh, unescalated cut
    assert h.cap == 19


def test_preemptions_without_a_queue_are_never_escalated() -> None:
    h = Harness(initial_inflight=100, frozen_steps=0)
    h.inflight = 100
    h.poll(preemptions=1)
    h.inflight = 90
    h.poll()  # drained
    h.poll(preemptions=1, queued=0)  # resident sequences grew: a plain backoff
    assert h.cap == 81


def test_a_cut_backs_off_from_what_the_engines_serve() -> None:
    h = Harness(initial_inflight=1024, frozen_steps=0)
    h.inflight = 1024
    h.poll(preemptions=3, running=300, queued=700)
    assert h.cap == math.floor(c.BACKOFF_FACTOR * 1024 * 300 / 1000)  # near capacity at once
    assert h.overloads == [1024 - h.cap]


def test_a_growth_clears_escalation() -> None:
    h = Harness(initial_inflight=100, frozen_steps=0)
    h.inflight = 100
    h.poll(preemptions=1)
    h.inflight = 90
    h.poll()  # drained, escalation armed
    h.turnover()  # a deliberate raise
    assert h.cap == 112
    h.inflight = 112
    h.poll(preemptions=1, running=40, queued=40)  # swamped, but after a raise: not halved
    assert h.cap == 50  # 0.9 x the 56 served


def test_only_decode_engines_count() -> None:
    h = Harness(initial_inflight=50, frozen_steps=0)
    h.inflight = 50
    assert h.poll(preemptions=9, role="prefill") == "CLEAR"
    assert h.cap == 50


def test_cost_estimate_is_bias_corrected_and_blends_eval() -> None:
    h = Harness(initial_inflight=10, frozen_steps=0)
    h.complete(tokens=1000)
    h.complete(tokens=3000)
    # the bias-corrected mean early on, not anchored on the first episode's 1000
    assert h.ctl.expected_cost() == pytest.approx(2000, rel=1e-3)
    h.complete(tokens=10_000, kind="eval")
    h.eval_share = 0.5
    assert h.ctl.expected_cost() == pytest.approx(6000, rel=1e-3)
    h.poll(usage=0.9, running=10, capacity=100_000)  # engines hold 9000 tokens per request
    assert h.ctl.expected_cost() == 9000  # floored by what the engines measure


def test_bounds_clamp_everything() -> None:
    h = Harness(initial_inflight=4, min_inflight=4, max_inflight=5, frozen_steps=0)
    h.inflight = 100
    h.poll(preemptions=1)
    assert h.cap == 4
    h.poll()
    h.inflight = 3
    for _ in range(5):
        h.poll()
        h.turnover()
    assert h.cap == 5
    assert h.ctl.gauges()["concurrency/cap"] == 5.0


def test_state_round_trips_for_resume() -> None:
    h = Harness(frozen_steps=1)
    h.poll(capacity=100_000, max_len=4096)  # bootstraps at 24
    h.complete(tokens=1500)
    h.ctl.on_step()
    h.turnover()
    saved = h.ctl.state_dict()
    resumed = Harness(frozen_steps=1)
    resumed.ctl.load_state_dict(saved)
    assert resumed.cap == h.cap and resumed.limits == [h.cap]
    assert {k: c.value for k, c in resumed.ctl.state.costs.items()} == {
        k: c.value for k, c in h.ctl.state.costs.items()
    }
    resumed.poll(capacity=400_000, max_len=4096)
    assert resumed.cap == h.cap  # no second bootstrap, and the freeze stays over
    resumed.turnover()
    assert resumed.cap > h.cap


def test_a_weight_sync_pause_and_a_slower_engine_are_not_overload() -> None:
    """The quickstart's cut to 2 on a light workload: while a weight sync paused the engine,
    nothing ran and arrivals queued; read as capacity queueing, the cut backed off from a
    served share of zero down to min_inflight. Paused polls say nothing, and requests that only
    wait for the next engine step (a step slowed by training on the same cores) are deferred,
    not refused for capacity."""
    h = Harness(initial_inflight=64, frozen_steps=0)
    h.inflight = 64
    for _ in range(c.QUEUE_PERSISTENCE_POLLS + 2):
        # paused in place: the running batch is held, arrivals wait (reported as waiting)
        assert h.poll(running=8, queued=40, usage=0.05, paused=True) == "CLEAR"
    for _ in range(c.QUEUE_PERSISTENCE_POLLS + 2):
        assert h.poll(running=24, arrived=40, usage=0.1) == "CLEAR"
    for _ in range(c.QUEUE_PERSISTENCE_POLLS + 2):  # an unpaused stall: no served share
        assert h.poll(running=0, queued=40, usage=0.0) == "CLEAR"
    assert h.cap == 64 and h.ctl.state.cuts == 0 and h.overloads == []
    for _ in range(c.QUEUE_PERSISTENCE_POLLS):  # real refusals still cut
        signal = h.poll(running=24, queued=40, usage=0.97)
    assert signal == "HARD" and h.cap is not None and h.cap < 64


def test_engines_without_a_capacity_metric_do_not_pin_the_cap_to_one() -> None:
    h = Harness(frozen_steps=0)
    h.poll(capacity=0, usage=0.0)
    assert h.cap == c.UNKNOWN_CAPACITY_START  # not max(1, 0 // max_len)
    h.poll(capacity=0, usage=0.0)
    h.turnover()
    assert h.cap == 20  # grows by the slew alone: there is no token budget to compute
    h.poll(capacity=0, usage=0.0, running=20, queued=10)
    h.poll(capacity=0, usage=0.0, running=20, queued=10)
    assert h.poll(capacity=0, usage=0.0, running=20, queued=10) == "HARD"
    assert h.cap is not None and h.cap < 20  # measured overload still cuts
