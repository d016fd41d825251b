"""The coding-agent CLI environments with a stand-in CLI (a shell script that records how it
was started): each episode's own directory and home, the session in the CLI's terms, the task's
files, the check as reward, and a failing CLI's output kept as its error (or its reason)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tracerl.config import ConfigError
from tracerl.envs import Session, make_environment, run_episode

SESSION = Session(
    session_id="s1",
    api_key="session-key",
    openai_base_url="http://127.0.0.1:9/s/s1/v1",
    anthropic_base_url="http://127.0.0.1:9/s/s1",
)
FAKE_CLI = """#!/bin/sh
printf '%s\\n' "$@" > "$OUT/args"
env > "$OUT/env"
pwd > "$OUT/cwd"
echo made > made.txt
[ -z "$FAIL" ] || { echo "API Error: 400 the prompt is 9000 tokens" >&2; exit 3; }
"""


@pytest.fixture
def cli(tmp_path: Path) -> Path:
    path = tmp_path / "fake-cli"
    path.write_text(FAKE_CLI)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("name", ["claude-code", "codex"])
async def test_an_episode_runs_the_cli_in_its_own_directory_against_the_session(
    tmp_path: Path, cli: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "the-user-s-own")  # never reaches the CLI
    out = tmp_path / "out"
    out.mkdir()
    env = make_environment(
        {"name": name, "executable": str(cli), "env": {"OUT": str(out)}, "model": "m"}
    )
    task = {
        "prompt": "do it",
        "files": {"src/a.py": "x = 1\n"},
        "check": "test -f src/a.py -a -f made.txt",
    }
    result = await run_episode(env, task, SESSION, 30)
    assert result.reward == 1.0 and not result.failed, result.reason
    args = (out / "args").read_text().splitlines()
    seen = dict(
        line.split("=", 1) for line in (out / "env").read_text().splitlines() if "=" in line
    )
    cwd = Path((out / "cwd").read_text().strip())
    assert not cwd.exists()  # removed after the episode
    assert seen["HOME"] == str(cwd / ".agent-home")
    if name == "claude-code":
        assert args[:3] == ["-p", "do it", "--model"] and "--allowedTools" in args
        assert seen["ANTHROPIC_BASE_URL"] == SESSION.anthropic_base_url
        assert seen["ANTHROPIC_API_KEY"] == "session-key"
        assert seen["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    else:
        assert args[:2] == ["exec", "--skip-git-repo-check"] and args[-1] == "do it"
        provider = next(a for a in args if a.startswith("model_providers.tracerl="))
        assert f'base_url="{SESSION.openai_base_url}"' in provider
        assert 'wire_api="responses"' in provider and seen["TRACERL_API_KEY"] == "session-key"
        assert seen["CODEX_HOME"] == str(cwd / ".agent-home" / ".codex")
    assert "OPENAI_API_KEY" not in seen


async def test_a_failed_check_is_reward_zero_and_a_failing_cli_says_why(
    tmp_path: Path, cli: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    config = {"name": "claude-code", "executable": str(cli), "env": {"OUT": str(out)}}
    env = make_environment({**config, "check": "test -f nothing-here"})
    assert (await run_episode(env, {"prompt": "x"}, SESSION, 30)).reward == 0.0
    # a CLI that exits non-zero is scored all the same, its error kept (the loop fails an
    # episode that recorded nothing with it); with agent_errors = "fail" it fails the episode
    erring = {**config, "check": "test -f made.txt", "env": {"OUT": str(out), "FAIL": "1"}}
    result = await run_episode(make_environment(erring), {"prompt": "x"}, SESSION, 30)
    assert result.reward == 1.0 and not result.failed and result.metrics == {"agent_error": 1.0}
    assert "exited with status 3" in (result.error or "")
    assert "the prompt is 9000 tokens" in (result.error or "")
    failing = make_environment({**erring, "agent_errors": "fail"})
    result = await run_episode(failing, {"prompt": "x"}, SESSION, 30)
    assert result.failed and "exited with status 3" in (result.reason or "")
    assert "the prompt is 9000 tokens" in (result.reason or "")
    clean = await run_episode(
        make_environment({**erring, "env": {"OUT": str(out)}}), {"prompt": "x"}, SESSION, 30
    )
    assert clean.metrics == {"agent_error": 0.0} and clean.error is None
    escaping = await run_episode(env, {"prompt": "x", "files": {"../up": "x"}}, SESSION, 30)
    assert escaping.failed and "outside the working directory" in (escaping.reason or "")
    no_reward = make_environment(config)
    result = await run_episode(no_reward, {"prompt": "x"}, SESSION, 30)
    assert result.failed and "no check and no reward_fn" in (result.reason or "")
    with pytest.raises(ConfigError, match="sandbox"):
        make_environment({"name": "codex", "sandbox": "none"})


@pytest.mark.parametrize("name", ["claude-code", "codex", "command"])
@pytest.mark.parametrize("traced", [True, False])
async def test_the_episode_s_trace_context_reaches_the_agent_as_traceparent(
    tmp_path: Path, cli: Path, name: str, traced: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With telemetry on the session carries the episode's span: the agent gets it as
    TRACEPARENT; off, none is set."""
    monkeypatch.delenv("TRACEPARENT", raising=False)
    out = tmp_path / "out"
    out.mkdir()
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    session = replace(SESSION, traceparent=traceparent if traced else None)
    if name == "command":
        env = make_environment({"name": name, "argv": [str(cli)], "env": {"OUT": str(out)}})
        seen = env.agent_env(session)  # type: ignore[attr-defined]
    else:
        config = {"name": name, "executable": str(cli), "env": {"OUT": str(out)}}
        env = make_environment({**config, "check": "true"})
        assert (await run_episode(env, {"prompt": "p"}, session, 30)).reward == 1.0
        lines = (out / "env").read_text().splitlines()
        seen = dict(line.split("=", 1) for line in lines if "=" in line)
    assert seen.get("TRACEPARENT") == (traceparent if traced else None)
