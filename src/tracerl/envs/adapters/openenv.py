"""`openenv`: an OpenEnv environment server stepped with the model's replies, its observations
as user turns, its own reward.

The server is one at `env.url`, or `env.app` (`module:app`) which the run starts itself before
the first episode (uvicorn on 127.0.0.1, a free port, in a process group of its own) and stops
at its end. Each episode opens a session of its own through OpenEnv's client
(`GenericEnvClient`, the WebSocket protocol: OpenEnv's HTTP `/reset` and `/step` make a new
environment per request and cannot hold an episode), resets it with the task's `seed` and reset
arguments, and then, until the observation says `done` or `env.max_turns` model turns have
passed: the observation's text becomes a user message, the model's reply goes back as the
action (`{env.action_field: reply}`). Messages grow by appending only, so the gateway records
one trajectory per episode. The reward is the environment's: the sum of the rewards it gave
(`env.reward = "sum"`, its return) or the last one.

A server error (a refused action, an environment that raised, a session past the server's
capacity) fails the episode with OpenEnv's message. OpenEnv refuses sessions beyond its
`max_concurrent_envs` rather than queueing them: `env.max_sessions` holds episodes back here.

Text actions only: an MCP tool environment (`list_tools`/`call_tool` actions) is not mapped to
the model's tool calls yet. Tested with openenv-core 0.3.0 (the `openenv` extra pins it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Any

from tracerl.config.envs import OpenEnvEnvConfig
from tracerl.envs.adapters import missing_extra, seeded_tasks
from tracerl.envs.base import EnvResult, Session, Task, sampling_params, turn_seed
from tracerl.envs.chat import openai_client


class ServerFailed(RuntimeError):
    """The OpenEnv server the run started did not come up."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def observation_text(observation: dict[str, Any], field: str | None) -> str:
    """What the model is told of an observation (see `OpenEnvEnvConfig.observation_field`)."""
    if field is not None:
        if field not in observation:
            raise KeyError(
                f"env.observation_field: the observation has no field {field!r} "
                f"(it has {sorted(observation)})"
            )
        value = observation[field]
        return value if isinstance(value, str) else json.dumps(value)
    texts = [v for v in observation.values() if isinstance(v, str)]
    return texts[0] if len(texts) == 1 else json.dumps(observation, sort_keys=True)


class OpenEnvEnvironment:
    name = "openenv"
    task_fields: tuple[str, ...] = ()
    reward_fn = None  # the environment scores every episode

    def __init__(self, config: OpenEnvEnvConfig) -> None:
        try:
            from openenv.core import GenericEnvClient
            from websockets.exceptions import ConnectionClosed  # its client's transport
        except ImportError as e:
            raise missing_extra("openenv", "openenv", e) from None
        self.config = config
        self.client_class = GenericEnvClient
        self.closed_error = ConnectionClosed
        self.url = config.url
        self.server: subprocess.Popen[bytes] | None = None
        self.server_log: Any = None
        self._starting = asyncio.Lock()
        self._sessions = asyncio.Semaphore(config.max_sessions) if config.max_sessions else None

    def tasks(self, split: str, num_tasks: int | None, seed: int) -> list[Task]:
        return seeded_tasks(self.name, split, num_tasks, seed)

    async def _base_url(self) -> str:
        async with self._starting:
            if self.url is None:
                self.url = await self._start()
            return self.url

    async def _start(self) -> str:
        """Start `env.app` under uvicorn and wait for its `/health`."""
        import aiohttp

        c = self.config
        assert c.app is not None
        port = free_port()
        argv = [c.python or sys.executable, "-m", "uvicorn", c.app, "--host", "127.0.0.1",
                "--port", str(port), "--log-level", "warning"]  # fmt: skip
        self.server_log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self.server = subprocess.Popen(
            argv, cwd=c.cwd, env={**os.environ, **c.server_env}, stdin=subprocess.DEVNULL,
            stdout=self.server_log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        deadline = asyncio.get_running_loop().time() + c.start_timeout_s
        async with aiohttp.ClientSession() as http:
            while True:
                if self.server.poll() is not None:
                    raise ServerFailed(
                        f"env.app: the OpenEnv server `{shlex.join(argv)}` exited with status "
                        f"{self.server.returncode}: {self._log_tail()}"
                    )
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{url}/health") as r:
                        if r.status == 200:
                            return url
                if asyncio.get_running_loop().time() > deadline:
                    self.close()
                    raise ServerFailed(
                        f"env.app: the OpenEnv server did not answer /health within "
                        f"{c.start_timeout_s:g} s (env.start_timeout_s): {self._log_tail()}"
                    )
                await asyncio.sleep(0.1)

    def _log_tail(self) -> str:
        if self.server_log is None:
            return ""
        self.server_log.seek(0)
        return self.server_log.read().decode(errors="replace")[-2000:].strip()

    def close(self) -> None:
        """Stop the server the run started (its whole process group)."""
        if self.server is not None and self.server.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()
        if self.server_log is not None:
            self.server_log.close()
            self.server_log = None

    async def run(self, task: Task, session: Session) -> EnvResult:
        url = await self._base_url()
        async with self._sessions or contextlib.nullcontext():
            return await self._play(url, task, session)

    async def _play(self, url: str, task: Task, session: Session) -> EnvResult:
        c = self.config
        sampling = sampling_params(c.sampling.model_dump(), session)
        reset_args = {**c.reset_args, **(task.get("reset_args") or {})}
        if "seed" in task:
            reset_args["seed"] = task["seed"]
        messages: list[Any] = []
        if c.system_prompt is not None:
            messages.append({"role": "system", "content": c.system_prompt})
        rewards: list[float] = []
        turns = 0
        env = self.client_class(base_url=url, message_timeout_s=c.message_timeout_s)
        async with env, openai_client(session, c.request_timeout_s) as client:
            try:
                result = await env.reset(**reset_args)
            except self.closed_error as e:  # how a server at capacity answers a new session
                raise ConnectionError(
                    f"the OpenEnv server at {url} closed the session before its reset ({e}); "
                    "a server at its max_concurrent_envs does: set env.max_sessions to that"
                ) from e
            while True:
                if result.reward is not None:
                    rewards.append(float(result.reward))
                if result.done or turns >= c.max_turns:
                    break
                text = observation_text(dict(result.observation or {}), c.observation_field)
                messages.append({"role": "user", "content": text})
                reply = await client.chat.completions.create(
                    model=session.model, messages=messages, **turn_seed(sampling, turns)
                )
                turns += 1
                move = reply.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": move})
                result = await env.step({c.action_field: move})
        reward = (sum(rewards) if c.reward == "sum" else rewards[-1]) if rewards else 0.0
        metrics = {"turns": float(turns), "done": float(bool(result.done))}
        return EnvResult(reward, metrics)
