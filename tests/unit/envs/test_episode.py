"""`run_episode` and `score_trace` over scripted environments that implement the protocol."""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

import pytest

from tracerl.envs import EnvResult, EpisodeResult, Session, run_episode, score_trace
from tracerl.envs.base import Task, TraceReward
from tracerl.trace.schema import SessionTrace

SESSION = Session.from_gateway(
    {
        "session_id": "s1",
        "api_key": "k",
        "openai_base_url": "http://127.0.0.1:9/s/s1/v1",
        "anthropic_base_url": "http://127.0.0.1:9/s/s1",
    },
    sampling={"temperature": 0.5},
)
TRACE = SessionTrace(session_id="s1", status="closed", turns=[], trajectories=[])


@dataclass
class ScriptedEnvironment:
    """Does what it is told: return a result, raise, or sleep forever."""

    result: EnvResult | None = None
    error: Exception | None = None
    hang: bool = False
    reward_fn: TraceReward | None = None
    name: str = "scripted"
    task_fields: tuple[str, ...] = ()
    cancelled: bool = False

    async def run(self, task: Task, session: Session) -> EnvResult:
        try:
            if self.hang:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


async def test_a_result_passes_through() -> None:
    env = ScriptedEnvironment(EnvResult(0.75, {"turns": 2.0}))
    result = await run_episode(env, {}, SESSION, timeout_s=5)
    assert (result.reward, result.metrics, result.failed, result.reason) == (
        0.75,
        {"turns": 2.0},
        False,
        None,
    )
    assert result.duration_s >= 0


async def test_a_timeout_is_a_failed_episode_and_cancels_the_environment(caplog) -> None:
    env = ScriptedEnvironment(hang=True)
    with caplog.at_level(logging.WARNING):
        result = await run_episode(env, {}, SESSION, timeout_s=0.05)
    assert result.failed and result.reward is None
    assert result.reason == "timeout: the episode ran past 0.05 s"
    assert env.cancelled
    assert "timeout" in caplog.text and "s1" in caplog.text


async def test_an_exception_is_a_failed_episode_with_type_and_message(caplog) -> None:
    env = ScriptedEnvironment(error=KeyError("answer"))
    with caplog.at_level(logging.WARNING):
        result = await run_episode(env, {}, SESSION, timeout_s=5)
    assert result.failed and result.reason == "KeyError: 'answer'"
    assert "Traceback" in caplog.text  # logged with its traceback, not swallowed


async def test_a_timeout_raised_inside_is_not_reported_as_ours() -> None:
    env = ScriptedEnvironment(error=TimeoutError("read timed out"))
    result = await run_episode(env, {}, SESSION, timeout_s=5)
    assert result.failed and result.reason == "TimeoutError: read timed out"


async def test_cancellation_propagates() -> None:
    env = ScriptedEnvironment(hang=True)
    task = asyncio.create_task(run_episode(env, {}, SESSION, timeout_s=60))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert env.cancelled


@pytest.mark.parametrize("reward", [math.nan, math.inf])
async def test_a_non_finite_reward_fails(reward: float) -> None:
    result = await run_episode(ScriptedEnvironment(EnvResult(reward)), {}, SESSION, timeout_s=5)
    assert result.failed and "non-finite" in (result.reason or "")


async def test_no_reward_without_a_reward_fn_fails() -> None:
    result = await run_episode(ScriptedEnvironment(EnvResult(None)), {}, SESSION, timeout_s=5)
    assert result.failed and result.reason == (
        "environment scripted returned no reward and has no reward_fn"
    )


async def test_the_trace_scores_an_episode_that_left_the_reward_to_it() -> None:
    env = ScriptedEnvironment(EnvResult(None, {"steps": 3.0}), reward_fn=lambda task, trace: 0.25)
    result = await run_episode(env, {}, SESSION, timeout_s=5)
    assert result.needs_trace_reward and not result.failed
    scored = score_trace(env, {}, result, TRACE)
    assert (scored.reward, scored.metrics, scored.failed) == (0.25, {"steps": 3.0}, False)
    assert score_trace(env, {}, scored, TRACE) is scored  # already scored: unchanged


def test_a_failing_reward_fn_fails_the_episode() -> None:
    def broken(task: Task, trace: SessionTrace) -> float:
        raise ValueError("no answer field")

    env = ScriptedEnvironment(reward_fn=broken)
    scored = score_trace(env, {}, EpisodeResult(None), TRACE)
    assert scored.failed and scored.reason == "reward_fn: ValueError: no answer field"
    nan_env = ScriptedEnvironment(reward_fn=lambda task, trace: math.nan)
    assert score_trace(nan_env, {}, EpisodeResult(None), TRACE).failed
    failed = EpisodeResult(None, failed=True, reason="timeout")
    assert score_trace(env, {}, failed, TRACE) is failed  # a failed episode stays failed
