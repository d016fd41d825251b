"""The `command` environment: real agent processes (tests/agents/, examples/agents/) against a real
gateway in front of the scripted fake engine; crashes and hangs become failed episodes, and a hung
agent's whole process group is killed."""

from __future__ import annotations

import asyncio
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tracerl.config.envs import DatasetConfig, parse_env_config
from tracerl.envs import Session, load_dataset, make_environment, run_episode, score_trace
from tracerl.trace.schema import SessionTrace

ROOT = Path(__file__).parents[2]
AGENTS = ROOT / "tests" / "agents"
TASK = {"prompt": "What is 17 + 25?", "answer": 42}
# For agents that never call the model: nothing listens on port 9.
NO_GATEWAY = Session("s", "k", "http://127.0.0.1:9/s/s/v1", "http://127.0.0.1:9/s/s")


def agent(name: str, **config: Any) -> Any:
    return make_environment(
        {"name": "command", "argv": [sys.executable, str(AGENTS / name)], **config}
    )


async def open_session(gw: Any, **sampling: Any) -> Session:
    return Session.from_gateway(await gw.open_session(), sampling=sampling)


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped by whatever adopted it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def wait_until_dead(pids: list[int], deadline_s: float = 10.0) -> list[int]:
    """The pids still alive once all have died or the deadline passed."""
    deadline = time.monotonic() + deadline_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return [p for p in pids if alive(p)]


async def test_agent_reward_from_stdout(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = agent("answer_agent.py", env={"AGENT_EXTRA": "set-by-config"})
    fake.say("The answer is 42.")
    session = await open_session(gw, temperature=0.25, max_tokens=24)
    result = await run_episode(env, TASK, session, timeout_s=60)
    assert (result.reward, result.failed, result.reason) == (1.0, False, None)
    assert result.metrics == {"reply_chars": 17.0, "anthropic_env": 1.0, "extra_env": 1.0}
    (turn,) = (await gw.trace(session.session_id))["turns"]
    assert turn["endpoint"] == "chat.completions"
    assert turn["request"]["messages"] == [{"role": "user", "content": TASK["prompt"]}]
    (request,) = fake.requests
    assert request["sampling_params"]["temperature"] == 0.25  # passed on via TRACERL_SAMPLING
    assert request["sampling_params"]["max_new_tokens"] == 24


async def test_agent_on_the_anthropic_sdk(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    fake.say("41")
    session = await open_session(gw)
    result = await run_episode(
        agent("answer_agent.py"), {**TASK, "api": "anthropic"}, session, timeout_s=60
    )
    assert (result.reward, result.failed) == (0.0, False)
    (turn,) = (await gw.trace(session.session_id))["turns"]
    assert turn["endpoint"] == "messages"


async def test_reward_fn_scores_an_agent_that_prints_none(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    fake.say("17 + 25 = 42", "17 + 25 = 42")
    task = {**TASK, "print_reward": False}
    env = agent("answer_agent.py", reward_fn="arithmetic")
    session = await open_session(gw)
    result = await run_episode(env, task, session, timeout_s=60)
    assert result.needs_trace_reward and result.reward is None
    trace = SessionTrace.model_validate(await gw.trace(session.session_id))
    scored = score_trace(env, task, result, trace)
    assert (scored.reward, scored.failed) == (1.0, False)

    unscored = await run_episode(agent("answer_agent.py"), task, await open_session(gw), 60)
    assert unscored.failed
    assert "no reward_fn is configured; last line: 'agent said: 17 + 25 = 42'" in (
        unscored.reason or ""
    )


async def test_a_crashing_agent_fails_with_its_exit_status_and_stderr() -> None:
    result = await run_episode(agent("crash_agent.py"), TASK, NO_GATEWAY, timeout_s=30)
    assert result.failed and result.reward is None
    assert result.reason is not None and result.reason.startswith("AgentError: agent ")
    assert "exited with status 3; stderr: ...agent: cannot parse the task" in result.reason


async def test_a_missing_program_fails_the_episode() -> None:
    env = make_environment({"name": "command", "argv": ["/nonexistent/agent-binary"]})
    result = await run_episode(env, TASK, NO_GATEWAY, timeout_s=30)
    assert result.failed and (result.reason or "").startswith("FileNotFoundError: ")


@pytest.mark.parametrize("who_times_out", ["agent timeout_s", "episode timeout_s"])
async def test_a_hanging_agent_and_its_child_are_killed(tmp_path, who_times_out: str) -> None:
    pids_file = tmp_path / "pids"
    agent_timeout, episode_timeout = (2.0, 60.0) if who_times_out == "agent timeout_s" else (60, 2)
    env = agent("hang_agent.py", timeout_s=agent_timeout, env={"HANG_PIDS_FILE": str(pids_file)})
    result = await run_episode(env, TASK, NO_GATEWAY, timeout_s=episode_timeout)
    assert result.failed and result.reward is None
    if who_times_out == "agent timeout_s":
        assert (result.reason or "").startswith("AgentTimeout: agent ")
        assert "ran past timeout_s=2; its process group was killed" in (result.reason or "")
    else:
        assert result.reason == "timeout: the episode ran past 2 s"
    pids = [int(p) for p in pids_file.read_text().split()]  # written before it hung
    assert len(pids) == 2
    assert await wait_until_dead(pids) == []


def test_the_example_config_parses() -> None:
    raw = tomllib.loads((ROOT / "examples" / "agents" / "command_env.toml").read_text())
    env = parse_env_config(raw["env"])
    assert env.name == "command" and env.argv[-1] == "examples/agents/arithmetic_agent.py"
    assert len(load_dataset(DatasetConfig(**raw["dataset"]))) == 1000


async def test_the_example_agent_runs_unmodified(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    raw = tomllib.loads((ROOT / "examples" / "agents" / "command_env.toml").read_text())
    raw["env"]["argv"][0] = sys.executable  # the interpreter running the tests
    env = make_environment({**raw["env"], "cwd": str(ROOT)})
    fake.say("42")
    session = await open_session(gw)
    result = await run_episode(env, TASK, session, timeout_s=60)
    assert (result.reward, result.failed) == (1.0, False)
    (turn,) = (await gw.trace(session.session_id))["turns"]
    assert turn["request"]["messages"][0]["role"] == "system"


@pytest.mark.parametrize(
    ("stdout", "reward", "metrics"),
    [
        ('{"reward": 0.5}\n', 0.5, {}),
        (
            'log\n{"reward": 1, "metrics": {"steps": 3, "solved": true}}\n\n  \n',
            1.0,
            {"steps": 3.0, "solved": 1.0},
        ),
        ('{"reward": -2.5, "metrics": {}}', -2.5, {}),
    ],
)
async def test_reward_lines(stdout: str, reward: float, metrics: dict) -> None:
    result = await run_episode(agent("echo_agent.py"), {"stdout": stdout}, NO_GATEWAY, 30)
    assert (result.reward, result.metrics, result.failed) == (reward, metrics, False)


@pytest.mark.parametrize(
    ("stdout", "reason"),
    [
        ('{"reward": "high"}', "AgentError: reward must be a number, got 'high'"),
        ('{"reward": true}', "AgentError: reward must be a number, got True"),
        ('{"reward": NaN}', "AgentError: reward must be finite, got nan"),
        (
            '{"reward": 1, "metrics": {"k": "v"}}',
            "AgentError: metric 'k' must be a number, got 'v'",
        ),
        ('{"reward": 1, "metrics": [1]}', "AgentError: metrics must be a JSON object of numbers"),
        ('{"reward": 1}\ndone', "AgentError: the agent's last stdout line is not"),
        ("", "AgentError: the agent's last stdout line is not"),
    ],
)
async def test_bad_reward_lines_fail_the_episode(stdout: str, reason: str) -> None:
    result = await run_episode(agent("echo_agent.py"), {"stdout": stdout}, NO_GATEWAY, 30)
    assert result.failed and (result.reason or "").startswith(reason)


async def test_a_task_that_is_not_json_starts_no_agent(tmp_path) -> None:
    pids_file = tmp_path / "pids"
    env = agent("hang_agent.py", env={"HANG_PIDS_FILE": str(pids_file)})
    result = await run_episode(env, {"when": object()}, NO_GATEWAY, timeout_s=30)
    assert result.failed
    assert result.reason == "TypeError: Object of type object is not JSON serializable"
    assert not pids_file.exists()
