"""One episode as the loop sees it: run an environment under a timeout, and never let a failure out
as anything but a record.

`run_episode` turns a timeout or an exception into `EpisodeResult(failed=True, reason=...)`, with
the exception's type and message in the reason and the traceback in the log, so a failed episode
is visible and never reaches the trainer. Cancellation is not a failure: it propagates, because the
dispatcher sheds episodes by cancelling them. `score_trace` completes an episode whose environment
left the reward to its `reward_fn`, once the loop has fetched the session's trace.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field, replace

from tracerl.envs.base import Environment, Session, Task
from tracerl.trace.schema import SessionTrace

log = logging.getLogger(__name__)


class PlayerLost(RuntimeError):
    """Where the episode was being played is gone (an agent worker died) before it ended:
    nothing about the episode itself failed, so it may be played again elsewhere."""


@dataclass(frozen=True)
class EpisodeResult:
    """`reward is None` with `failed=False` means: score the trace with `score_trace`."""

    reward: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    failed: bool = False
    reason: str | None = None
    duration_s: float = 0.0
    error: str | None = None
    """The agent's error on a run that was scored anyway (`EnvResult.error`)."""

    @property
    def needs_trace_reward(self) -> bool:
        return not self.failed and self.reward is None


def _failed(reason: str, started: float, metrics: dict[str, float] | None = None) -> EpisodeResult:
    return EpisodeResult(
        None, metrics or {}, failed=True, reason=reason, duration_s=time.monotonic() - started
    )


async def run_episode(
    env: Environment, task: Task, session: Session, timeout_s: float
) -> EpisodeResult:
    """Run `env` on `task` in `session` for at most `timeout_s`; failures become records."""
    started = time.monotonic()
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            result = await env.run(task, session)
    except Exception as e:
        if isinstance(e, TimeoutError) and deadline.expired():
            reason = f"timeout: the episode ran past {timeout_s:g} s"
            log.warning("episode %s (%s) failed: %s", session.session_id, env.name, reason)
        else:
            reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            log.warning(
                "episode %s (%s) failed: %s", session.session_id, env.name, reason, exc_info=e
            )
        return _failed(reason, started)
    duration = time.monotonic() - started
    if result.reward is None and env.reward_fn is None:
        reason = f"environment {env.name} returned no reward and has no reward_fn"
        log.warning("episode %s failed: %s", session.session_id, reason)
        return _failed(reason, started, result.metrics)
    if result.reward is not None and not math.isfinite(result.reward):
        reason = f"environment {env.name} returned a non-finite reward {result.reward!r}"
        log.warning("episode %s failed: %s", session.session_id, reason)
        return _failed(reason, started, result.metrics)
    return EpisodeResult(
        result.reward, dict(result.metrics), duration_s=duration, error=result.error
    )


def score_trace(
    env: Environment, task: Task, episode: EpisodeResult, trace: SessionTrace
) -> EpisodeResult:
    """Fill in the reward of an episode that left it to `env.reward_fn`; anything else is returned
    unchanged. A reward function that raises or returns a non-finite value fails the episode."""
    if not episode.needs_trace_reward:
        return episode
    if env.reward_fn is None:
        reason = f"environment {env.name} returned no reward and has no reward_fn"
        return replace(episode, failed=True, reason=reason)
    try:
        reward = float(env.reward_fn(task, trace))
    except Exception as e:
        reason = f"reward_fn: {type(e).__name__}: {e}"
        log.warning("episode %s failed: %s", trace.session_id, reason, exc_info=e)
        return replace(episode, failed=True, reason=reason)
    if not math.isfinite(reward):
        reason = f"reward_fn returned a non-finite reward {reward!r}"
        log.warning("episode %s failed: %s", trace.session_id, reason)
        return replace(episode, failed=True, reason=reason)
    return replace(episode, reward=reward)
