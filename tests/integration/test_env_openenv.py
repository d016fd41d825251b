"""`openenv` against a real gateway in front of the scripted fake engine, with the real
openenv-core package serving an environment of the tests' own
(`tests/envpkgs/openenv_tracerl_toy.py`) under uvicorn, started by the adapter: every reply is
a step, every model call a recorded turn of one trajectory, the reward the environment's own
(recomputed here by stepping the environment class alone), and failures stay in their episode."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import sampled_only
from tests.integration.test_envs import open_session
from tracerl.config.base import ConfigError
from tracerl.envs import make_environment, run_episode

pytestmark = pytest.mark.envs  # `make test-envs` installs openenv-core
pytest.importorskip("openenv.core")

PACKAGES = Path(__file__).parents[1] / "envpkgs"


def config(**more: Any) -> dict[str, Any]:
    return {"name": "openenv", "app": "openenv_tracerl_toy:app", "cwd": str(PACKAGES), **more}


@pytest.fixture
async def started() -> AsyncIterator[list[Any]]:
    envs: list[Any] = []
    yield envs
    for env in envs:
        env.close()


def own_reward(seed: int, replies: list[str]) -> float:
    """The environment class alone, stepped with the recorded replies."""
    sys.path.insert(0, str(PACKAGES))
    try:
        from openenv_tracerl_toy import GuessGame, Reply
    finally:
        sys.path.remove(str(PACKAGES))
    game, total = GuessGame(), 0.0
    game.reset(seed=seed)
    for reply in replies:
        said = game.step(Reply(message=reply))
        total += said.reward or 0.0
        if said.done:
            break
    return total


def secret(seed: int) -> int:
    import random

    return random.Random(seed).randint(1, 16)


async def test_an_episode_steps_the_server_and_takes_its_reward(
    fake_engine, make_gateway, started
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment(config(system_prompt="Play the game."))
    started.append(env)
    task = env.tasks("train", 1, 0)[0]
    number = secret(task["seed"])
    wrong = 1 if number != 1 else 2
    replies = [f"Is it {wrong}?", f"I say {number}"]
    fake.say(*replies)
    session = await open_session(gw)
    result = await run_episode(env, task, session, timeout_s=60)
    assert (result.reward, result.failed) == (0.875, False)  # found at the second guess
    assert result.metrics == {"turns": 2.0, "done": 1.0}
    raw = await gw.trace(session.session_id)
    turns = raw["turns"]
    assert len(turns) == len(fake.requests) == 2
    assert turns[0]["request"]["messages"] == [
        {"role": "system", "content": "Play the game."},
        {"role": "user", "content": "Find my number from 1 to 16. Reply with a guess."},
    ]
    said = turns[1]["request"]["messages"][-1]["content"]
    assert said == ("higher" if number > wrong else "lower")  # the observation's text field
    sampled_only(raw)
    recorded = [t["response"]["choices"][0]["message"]["content"] for t in turns]
    assert own_reward(task["seed"], recorded) == 0.875

    # the same server by URL, from a second environment of the run's kind
    by_url = make_environment({"name": "openenv", "url": env.url, "max_turns": 1})
    fake.say(f"{number}")
    again = await run_episode(by_url, task, await open_session(gw), timeout_s=60)
    assert (again.reward, again.metrics["turns"]) == (1.0, 1.0)


async def test_failures_stay_in_their_episode_and_sessions_wait_for_room(
    fake_engine, make_gateway, started
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment(config(server_env={"TOY_MAX_ENVS": "1"}, max_sessions=1))
    started.append(env)
    tasks = env.tasks("train", 3, 0)
    fake.say("explode")
    broke = await run_episode(env, tasks[0], await open_session(gw), timeout_s=60)
    assert broke.failed and broke.reason is not None and "the game exploded" in broke.reason
    # a server of one session at a time, three episodes at once: max_sessions holds them back
    fake.say(*(["0"] * 12))
    sessions = [await open_session(gw) for _ in tasks]
    played = await asyncio.gather(
        *(run_episode(env, t, s, timeout_s=60) for t, s in zip(tasks, sessions, strict=True))
    )
    assert [(r.failed, r.metrics["turns"]) for r in played] == [(False, 4.0)] * 3
    assert {r.reward for r in played} == {0.0}
    # without the limit here, OpenEnv refuses the sessions past its capacity
    eager = make_environment({"name": "openenv", "url": env.url, "max_turns": 4})
    fake.say(*(["0"] * 12))
    sessions = [await open_session(gw) for _ in tasks]
    rushed = await asyncio.gather(
        *(run_episode(eager, t, s, timeout_s=60) for t, s in zip(tasks, sessions, strict=True))
    )
    refused = [r.reason for r in rushed if r.failed]
    assert refused and all("set env.max_sessions" in str(reason) for reason in refused)


async def test_the_server_it_started_stops_and_a_dead_one_is_named(started) -> None:
    env = make_environment(config())
    started.append(env)
    await env._base_url()
    server = env.server
    assert server is not None and server.poll() is None
    env.close()
    assert server.poll() is not None
    broken = make_environment(config(app="openenv_tracerl_toy:no_such_app"))
    started.append(broken)
    with pytest.raises(RuntimeError, match="env.app: the OpenEnv server .* exited with status"):
        await broken._base_url()


def test_settings(monkeypatch) -> None:
    for both in ({}, {"url": "http://127.0.0.1:1", "app": "m:app"}):
        with pytest.raises(ConfigError, match="set exactly one of url .* and app"):
            make_environment({"name": "openenv", **both})
    from tracerl.envs.adapters.openenv import observation_text

    assert observation_text({"text": "hi", "turn": 2}, None) == "hi"
    assert observation_text({"a": "x", "b": "y"}, None) == '{"a": "x", "b": "y"}'
    assert observation_text({"board": [[1]]}, "board") == "[[1]]"
    with pytest.raises(KeyError, match="observation_field: the observation has no field 'x'"):
        observation_text({"text": "hi"}, "x")
    env = make_environment(config())
    assert env.tasks("train", 5, 0) == env.tasks("train", 5, 0) != env.tasks("eval", 5, 0)
    monkeypatch.setitem(sys.modules, "openenv.core", None)
    with pytest.raises(ConfigError, match=r"pip install 'tracerl\[openenv\]'"):
        make_environment(config())
