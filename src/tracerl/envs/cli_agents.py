"""`claude-code` and `codex`: the real coding-agent CLIs, run non-interactively as episodes.

Each episode gets a fresh working directory (the task's `files` written into it) with its own
home and config directory, so no login, onboarding, user config or earlier session leaks in.
The CLI runs there without a shell, in a process group of its own, with the task's `prompt` as
its prompt, pointed at the session:

- Claude Code: `claude -p PROMPT --model M --output-format json --max-turns N --allowedTools ...`
  with `ANTHROPIC_BASE_URL` / `ANTHROPIC_API_KEY` (the session's), a fresh `HOME` and
  `CLAUDE_CONFIG_DIR`, `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` (no telemetry, update or
  registry requests: only the model calls), and `IS_SANDBOX=1` (it refuses to run its tools
  unattended as root otherwise).
- Codex: `codex exec --skip-git-repo-check --ephemeral --json -s SANDBOX -m M PROMPT` with a
  `tracerl` model provider (`wire_api = "responses"`, the session's OpenAI base URL, its key
  from `TRACERL_API_KEY`, no retries: the engine pool retries), analytics, plugins and update
  checks off, and `CODEX_HOME` in the episode's directory. Its stdin is /dev/null (it waits for
  stdin to end).

The reward is the task's (or the config's) `check`, a shell command run in the working
directory after the CLI exits (exit 0: reward 1, else 0), or else `reward_fn` over the trace. A
CLI that exits non-zero is scored all the same (`agent_errors = "score"`: it stopped on the
model's replies, which is what training should see) with the end of its output kept as the
episode's error; an episode that recorded no reply then fails with it, where the gateway's
error is (a prompt past the model's context says so: "the prompt is N tokens; the model's
context is M tokens"). `agent_errors = "fail"` fails every such episode. A CLI that runs past
`timeout_s` is killed with its process group and fails the episode. With telemetry on, both
get `TRACEPARENT` (the episode's span) in their environment.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, cast

from tracerl.config.envs import ClaudeCodeEnvConfig, CliAgentEnvConfig, CodexEnvConfig
from tracerl.envs.base import EnvResult, Session, Task, TraceReward
from tracerl.envs.command import OUTPUT_TAIL_CHARS, AgentError, run_agent, with_traceparent
from tracerl.envs.rewards import load_reward_fn


class CliAgentEnvironment(ABC):
    """What both CLIs share: the working directory, the run, the check."""

    name: str
    task_fields: tuple[str, ...] = ("prompt",)

    def __init__(self, config: CliAgentEnvConfig) -> None:
        exe = config.executable  # a path runs from the episode's directory: make it absolute
        if "/" in exe:
            config = config.model_copy(update={"executable": str(Path(exe).resolve())})
        self.config = config
        self.reward_fn: TraceReward | None = (
            load_reward_fn(config.reward_fn) if config.reward_fn is not None else None
        )

    @abstractmethod
    def command(
        self, prompt: str, session: Session, home: Path
    ) -> tuple[list[str], dict[str, str]]:
        """The CLI's argv and environment for one episode."""

    async def run(self, task: Task, session: Session) -> EnvResult:
        work = Path(tempfile.mkdtemp(prefix=f"tracerl-{self.name}-"))
        try:
            _write_files(work, task.get("files") or {})
            home = work / ".agent-home"
            home.mkdir()
            argv, env = self.command(str(task["prompt"]), session, home)
            env = with_traceparent(env, session)
            stdout, stderr, code = await run_agent(
                argv, env, str(work), self.config.timeout_s, None
            )
            error = None
            if code != 0:
                output = (stdout + b"\n" + stderr).decode(errors="replace").strip()
                where = f" (kept: {work})" if self.config.keep_workdir else ""
                error = (
                    f"{self.name} exited with status {code}{where}: "
                    f"...{output[-OUTPUT_TAIL_CHARS:]}"
                )
                if self.config.agent_errors == "fail":
                    raise AgentError(error)
            metrics = {"agent_error": float(error is not None)}
            check = task.get("check") or self.config.check
            if check:
                return EnvResult(await self._check(str(check), work, env), metrics, error)
            if self.reward_fn is None:
                raise AgentError(f"{self.name}: no check and no reward_fn to score the episode")
            return EnvResult(None, metrics, error)
        finally:
            if not self.config.keep_workdir:
                shutil.rmtree(work, ignore_errors=True)

    async def _check(self, check: str, work: Path, env: dict[str, str]) -> float:
        proc = await asyncio.create_subprocess_shell(
            check,
            cwd=work,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(self.config.check_timeout_s):
                code = await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AgentError(
                f"check {check!r} ran past {self.config.check_timeout_s:g} s"
            ) from None
        return 1.0 if code == 0 else 0.0

    def base_env(self, home: Path) -> dict[str, str]:
        """This process's environment without any model endpoint of its own, with a fresh
        home and the config's extra variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))}
        env.update({"HOME": str(home), "NO_COLOR": "1"})
        env.update(self.config.env)
        return env


class ClaudeCodeEnvironment(CliAgentEnvironment):
    name = "claude-code"

    def __init__(self, config: ClaudeCodeEnvConfig) -> None:
        super().__init__(config)
        self.cli = cast(ClaudeCodeEnvConfig, self.config)

    def command(
        self, prompt: str, session: Session, home: Path
    ) -> tuple[list[str], dict[str, str]]:
        c = self.cli
        env = self.base_env(home)
        env.update(
            {
                "ANTHROPIC_BASE_URL": session.anthropic_base_url,
                "ANTHROPIC_API_KEY": session.api_key,
                "CLAUDE_CONFIG_DIR": str(home / ".claude"),
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
                "IS_SANDBOX": "1",
            }
        )
        argv = [
            c.executable, "-p", prompt, "--model", c.model, "--output-format", "json",
            "--max-turns", str(c.max_turns), "--allowedTools", " ".join(c.allowed_tools), *c.args,
        ]  # fmt: skip
        return argv, env


class CodexEnvironment(CliAgentEnvironment):
    name = "codex"

    def __init__(self, config: CodexEnvConfig) -> None:
        super().__init__(config)
        self.cli = cast(CodexEnvConfig, self.config)

    def command(
        self, prompt: str, session: Session, home: Path
    ) -> tuple[list[str], dict[str, str]]:
        c = self.cli
        env = self.base_env(home)
        env.update({"CODEX_HOME": str(home / ".codex"), "TRACERL_API_KEY": session.api_key})
        (home / ".codex").mkdir()
        provider = (
            f'{{name="tracerl",base_url="{session.openai_base_url}",env_key="TRACERL_API_KEY",'
            'wire_api="responses",request_max_retries=0,stream_max_retries=0}'
        )
        argv = [
            c.executable, "exec", "--skip-git-repo-check", "--ephemeral", "--json",
            "--sandbox", c.sandbox, "-m", c.model,
            "-c", "model_provider=tracerl", "-c", f"model_providers.tracerl={provider}",
            "-c", "analytics.enabled=false", "-c", "features.plugins=false",
            "-c", "check_for_update_on_startup=false", *c.args, prompt,
        ]  # fmt: skip
        return argv, env


def _write_files(work: Path, files: Any) -> None:
    """A task's `files` (`{relative path: text}`) into the working directory."""
    if not isinstance(files, dict):
        raise AgentError("task field 'files' must be an object of relative path -> text")
    for name, text in files.items():
        path = Path(str(name))
        if path.is_absolute() or ".." in path.parts:
            raise AgentError(f"task file {name!r} is outside the working directory")
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(str(text))
