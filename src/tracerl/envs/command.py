"""`command`: run any external agent program as an episode, so an unmodified agent can be trained.

The agent is started without a shell, in a process group of its own, with the session in the
variables every SDK reads: `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`,
`ANTHROPIC_API_KEY` (plus `TRACERL_SESSION_ID`, `TRACERL_MODEL`, and `TRACERL_SAMPLING`, a JSON
object of sampling fields an agent may pass on; with telemetry on, `TRACEPARENT`, the episode's
span, which OpenTelemetry SDKs and a `traceparent` request header carry on). It reads the task
as one JSON line on stdin.

The reward is the last non-empty stdout line when that is a JSON object with a `"reward"` key,
for example `{"reward": 0.5, "metrics": {"steps": 3}}`. An agent that prints none is scored from
its trace by `reward_fn` (the loop calls it); without one that is an error. A non-zero exit, an
invalid reward line, or running past `timeout_s` fails the episode. Whatever happens, including
cancellation of the episode, the whole process group is killed on the way out, so an agent's
children never outlive its episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
from typing import Any

from tracerl.config.envs import CommandEnvConfig
from tracerl.envs.base import EnvResult, Session, Task, TraceReward, sampling_params
from tracerl.envs.rewards import load_reward_fn

# How much of an agent's stderr (and of an unparsable stdout line) goes into a failure reason.
OUTPUT_TAIL_CHARS = 2000


class AgentError(RuntimeError):
    """The agent failed: it exited non-zero, printed an invalid reward, or printed none."""


class AgentTimeout(RuntimeError):
    """The agent ran past `timeout_s`; its process group was killed."""


class CommandEnvironment:
    name = "command"
    task_fields: tuple[str, ...] = ()

    def __init__(self, config: CommandEnvConfig) -> None:
        self.config = config
        self.reward_fn: TraceReward | None = (
            load_reward_fn(config.reward_fn) if config.reward_fn is not None else None
        )

    def agent_env(self, session: Session) -> dict[str, str]:
        env = dict(os.environ) if self.config.inherit_env else {}
        env.update(self.config.env)
        env.update(
            {
                "OPENAI_BASE_URL": session.openai_base_url,
                "OPENAI_API_KEY": session.api_key,
                "ANTHROPIC_BASE_URL": session.anthropic_base_url,
                "ANTHROPIC_API_KEY": session.api_key,
                "TRACERL_SESSION_ID": session.session_id,
                "TRACERL_MODEL": session.model,
                "TRACERL_SAMPLING": json.dumps(
                    sampling_params(self.config.sampling.model_dump(), session)
                ),
            }
        )
        return with_traceparent(env, session)

    async def run(self, task: Task, session: Session) -> EnvResult:
        argv = self.config.argv
        payload = json.dumps(task).encode() + b"\n"  # before starting: a bad task starts nothing
        stdout, stderr, code = await run_agent(
            argv, self.agent_env(session), self.config.cwd, self.config.timeout_s, payload
        )
        if code != 0:
            raise AgentError(f"agent {argv[0]} {_exit_text(code)}{_tail(stderr)}")
        return self._result(stdout.decode(errors="replace"))

    def _result(self, stdout: str) -> EnvResult:
        lines = [line for line in stdout.splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        try:
            report: Any = json.loads(last) if last else None
        except json.JSONDecodeError:
            report = None
        if not isinstance(report, dict) or report.get("reward") is None:
            if self.reward_fn is None:
                raise AgentError(
                    'the agent\'s last stdout line is not {"reward": ...} and no reward_fn is '
                    f"configured; last line: {last[-OUTPUT_TAIL_CHARS:]!r}"
                )
            metrics = report.get("metrics") if isinstance(report, dict) else None
            return EnvResult(None, _metrics(metrics or {}))
        reward = report["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise AgentError(f"reward must be a number, got {reward!r}")
        if not math.isfinite(reward):
            raise AgentError(f"reward must be finite, got {reward!r}")
        return EnvResult(float(reward), _metrics(report.get("metrics") or {}))


async def run_agent(
    argv: list[str], env: dict[str, str], cwd: str | None, timeout_s: float, stdin: bytes | None
) -> tuple[bytes, bytes, int | None]:
    """Run an agent program without a shell, in a process group of its own: its stdout, stderr
    and exit status. `stdin` is written and closed (None: /dev/null, for agents that wait for
    their stdin to end). Past `timeout_s` it raises `AgentTimeout`; whatever happens the whole
    group is killed on the way out."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,  # its own process group, killed as a whole
    )
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            stdout, stderr = await proc.communicate(stdin)
    except TimeoutError:
        if not deadline.expired():
            raise
        raise AgentTimeout(
            f"agent {argv[0]} (pid {proc.pid}) ran past timeout_s={timeout_s:g}; "
            "its process group was killed"
        ) from None
    finally:
        # Also after a normal exit: children it left behind (still in the group) go too.
        with contextlib.suppress(ProcessLookupError):  # the group is already empty
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            await proc.wait()
    return stdout, stderr, proc.returncode


def with_traceparent(env: dict[str, str], session: Session) -> dict[str, str]:
    """`env` with `TRACEPARENT` set to the episode's span, when it has one (telemetry on)."""
    if session.traceparent is not None:
        env["TRACEPARENT"] = session.traceparent
    return env


def _metrics(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise AgentError(f"metrics must be a JSON object of numbers, got {raw!r}")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if not isinstance(value, int | float):  # true/false count as 1/0
            raise AgentError(f"metric {key!r} must be a number, got {value!r}")
        out[str(key)] = float(value)
    return out


def _exit_text(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:  # a signal number Python has no name for
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _tail(stderr: bytes) -> str:
    text = stderr.decode(errors="replace").strip()
    return f"; stderr: ...{text[-OUTPUT_TAIL_CHARS:]}" if text else "; no stderr"
