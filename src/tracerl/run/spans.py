"""What the loop tells telemetry: the `episode` spans' attributes and the `train.step` spans.

Episodes are the roots of their own traces, not children of a step: with async off-policy
training an episode is scheduled by the feeder, runs across steps and may be trained on by a
later one (or none), so no step is its parent; a trace per episode also keeps an agent's own
spans in a trace of a readable size. Gateway requests and engine generations hang below it.

A step's span is written once the step ends, from the times the loop measures anyway for its
metrics line (`time/*`): `train.step` with `train.wait_rollouts`, `train.update` and
`weight_sync` as children, so the spans and `metrics.jsonl` show the same figures.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tracerl.telemetry import AttributeValue, Telemetry

if TYPE_CHECKING:
    from tracerl.run.rollouts import Rollout


def episode_attributes(rollout: Rollout) -> dict[str, AttributeValue | None]:
    """An ended episode's outcome, for its span."""
    result = rollout.result
    return {
        "tracerl.session.id": rollout.session_id,
        "tracerl.episode.kind": rollout.kind,
        "tracerl.episode.reward": result.reward,
        "tracerl.episode.duration_s": result.duration_s,
        "tracerl.episode.failed": result.failed,
        "tracerl.episode.failure_reason": result.reason,
        "tracerl.episode.agent_error": result.error,
        "tracerl.episode.completion_tokens": rollout.tokens,
        "tracerl.episode.samples": len(rollout.samples),
        "tracerl.weight_version": rollout.version,
    }


def record_step(
    telemetry: Telemetry,
    step: int,
    phases: Mapping[str, tuple[float, float]],
    record: Mapping[str, Any],
) -> None:
    """The ended step `step` as a `train.step` span with one child per phase: `phases` maps a
    span name to its (start, seconds) on `time.monotonic`'s clock; `record` is the step's
    metrics line (its `time/*` and loss figures become attributes)."""
    if not telemetry.enabled:
        return
    to_wall = time.time_ns() - time.monotonic_ns()  # monotonic -> wall-clock nanoseconds
    starts = [start for start, _ in phases.values()]
    begin = int(min(starts) * 1e9) + to_wall
    figures = {
        f"tracerl.{name.replace('/', '.')}": float(value)
        for name, value in record.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and name.startswith(("time/", "actor/", "critic/", "kl/", "rollout/"))
    }
    span = telemetry.span(
        "train.step", attributes={"tracerl.step": step, **figures}, start_ns=begin
    )
    for name, (start, seconds) in phases.items():
        ns = int(start * 1e9) + to_wall
        child = telemetry.span(name, parent=span, attributes={"tracerl.step": step}, start_ns=ns)
        if name == "weight_sync":
            child.set("tracerl.weight_version", step)
        child.end(ns + int(seconds * 1e9))
    span.end()
