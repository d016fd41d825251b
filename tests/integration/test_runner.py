"""The episode runner over real gateways (HTTP, one SQLite store): sessions open on each
gateway in turn, an unreachable gateway is left out, and an episode whose player was lost is
played again in a new session."""

from __future__ import annotations

from typing import Any

import openai

from tracerl.envs import EnvResult, EpisodeResult, Session, Task
from tracerl.envs.episode import PlayerLost, run_episode
from tracerl.gateway.store import SQLiteTraceStore
from tracerl.run.rollouts import EpisodeRunner


async def ask(session: Session, prompt: str, max_tokens: int) -> None:
    """One chat request through the official SDK."""
    client = openai.AsyncOpenAI(
        base_url=session.openai_base_url, api_key=session.api_key, max_retries=0
    )
    async with client:
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens
        )


class OneTurn:
    """One chat request; reward 1."""

    name = "one-turn"
    task_fields = ("prompt",)
    reward_fn = None

    async def run(self, task: Task, session: Session) -> EnvResult:
        await ask(session, task["prompt"], 4)
        return EnvResult(1.0)


def turns(handle: Any) -> int:
    return int(handle.gateway.counters["turns_recorded"])


async def two_gateways(make_gateway: Any, fake_engine: Any, tmp_path: Any) -> tuple[Any, Any]:
    _, client = fake_engine
    store = SQLiteTraceStore(tmp_path / "traces.sqlite")
    a = await make_gateway(client, store)
    b = await make_gateway(client, SQLiteTraceStore(tmp_path / "traces.sqlite"), admin_key=None)
    b.gateway.admin_key = a.gateway.admin_key  # one run, one admin key
    return a, b


async def test_sessions_open_on_each_gateway_in_turn_and_a_lost_one_is_left_out(
    make_gateway, fake_engine, tmp_path
) -> None:
    a, b = await two_gateways(make_gateway, fake_engine, tmp_path)
    runner = EpisodeRunner(OneTurn(), [a.url, b.url], a.gateway.admin_key, a.store, timeout_s=30)
    try:
        for group in range(4):
            rollout = await runner.run({"prompt": "hi"}, group, "train", {})
            assert rollout.ok and len(rollout.samples) == 1
        assert turns(a) == turns(b) == 2
        await b.runner.cleanup()  # that gateway is gone
        for group in range(4, 7):
            assert (await runner.run({"prompt": "hi"}, group, "train", {})).ok
        assert turns(a) == 5 and runner.counters["gateways_lost"] == 1
        assert runner.gateway_urls == [a.url]
    finally:
        await runner.close()


async def test_an_episode_whose_player_was_lost_is_played_again_in_a_new_session(
    make_gateway, fake_engine, tmp_path
) -> None:
    handle = await make_gateway(fake_engine[1])
    env = OneTurn()
    losses = [2]  # the first two plays are lost

    async def player(task: Task, session: Session, timeout_s: float) -> EpisodeResult:
        result = await run_episode(env, task, session, timeout_s)  # its turn is recorded
        if losses[0]:
            losses[0] -= 1
            raise PlayerLost("agent worker 0 died: killed")
        return result

    runner = EpisodeRunner(
        env, [handle.url], handle.gateway.admin_key, handle.store, timeout_s=30, player=player
    )
    try:
        lost = await runner.run({"prompt": "hi"}, 0, "train", {})  # lost, and lost again
        assert lost.result.failed and lost.result.reason == "agent worker 0 died: killed"
        assert not lost.samples and runner.counters["episodes_replayed"] == 2
        losses[0] = 1
        replayed = await runner.run({"prompt": "hi"}, 1, "train", {})
        assert replayed.ok and len(replayed.samples) == 1
        assert runner.counters["episodes_replayed"] == 3
        # every play had its own session; the lost ones' turns stay in the store
        assert turns(handle) == 4 and lost.session_id != replayed.session_id
        lost_trace = await handle.store.trace(lost.session_id or "")
        assert lost_trace is not None and len(lost_trace.turns) == 1
        trace = await handle.store.trace(replayed.session_id or "")
        assert trace is not None and len(trace.turns) == 1
    finally:
        await runner.close()


class RefusedAgent:
    """An agent whose first request the gateway refuses, which then exits with the error, as
    a CLI does; scored all the same (`agent_errors = "score"`)."""

    name = "refused"
    task_fields = ("prompt",)
    reward_fn = None

    async def run(self, task: Task, session: Session) -> EnvResult:
        try:
            await ask(session, task["prompt"], 10**6)
        except openai.BadRequestError as e:
            return EnvResult(0.0, {"agent_error": 1.0}, f"agent exited: {e.message}")
        return EnvResult(1.0)


async def test_a_scored_episode_that_recorded_nothing_fails_with_the_agents_error(
    make_gateway, fake_engine
) -> None:
    handle = await make_gateway(fake_engine[1], max_model_len=512, max_tokens_policy="reject")
    runner = EpisodeRunner(
        RefusedAgent(), [handle.url], handle.gateway.admin_key, handle.store, timeout_s=30
    )
    try:
        rollout = await runner.run({"prompt": "hi"}, 0, "train", {})
    finally:
        await runner.close()
    assert not rollout.ok and rollout.result.failed
    reason = rollout.result.reason or ""
    assert reason.startswith("the episode recorded no sampled tokens: agent exited:")
    assert "max_tokens" in reason  # the gateway's refusal, in the caller's terms
