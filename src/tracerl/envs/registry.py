"""Environments and task generators by name: `make_environment(config)`, `generate_tasks(name)`.

A config given as a plain dict (a TOML table) is validated here, so an unknown key or a bad value
fails with its dotted path (`env.command.argvv: unknown key`) before any episode runs. A command
environment's `reward_fn` is resolved here too, for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tracerl.config.envs import (
    ArithmeticEnvConfig,
    CalculatorEnvConfig,
    ClaudeCodeEnvConfig,
    CodexEnvConfig,
    CommandEnvConfig,
    ConciseEnvConfig,
    EnvConfig,
    FilesEnvConfig,
    GuessEnvConfig,
    OpenEnvEnvConfig,
    ReasoningGymEnvConfig,
    TextArenaEnvConfig,
    VerifiersEnvConfig,
    parse_env_config,
)
from tracerl.envs import arithmetic, calculator, concise, files, guess
from tracerl.envs.arithmetic import ArithmeticEnvironment
from tracerl.envs.base import Environment, Task
from tracerl.envs.calculator import CalculatorEnvironment
from tracerl.envs.cli_agents import ClaudeCodeEnvironment, CodexEnvironment
from tracerl.envs.command import CommandEnvironment
from tracerl.envs.concise import ConciseEnvironment
from tracerl.envs.files import FilesEnvironment
from tracerl.envs.guess import GuessEnvironment

ENVIRONMENTS = (
    "arithmetic", "concise", "calculator", "guess", "files", "reasoning-gym", "textarena",
    "verifiers", "openenv", "command", "claude-code", "codex",
)  # fmt: skip
TASK_GENERATORS: dict[str, Callable[[int, int], list[Task]]] = {
    "arithmetic": arithmetic.generate_tasks,
    "concise": concise.generate_tasks,
    "calculator": calculator.generate_tasks,
    "calculator-long": calculator.generate_long_tasks,
    "calculator-mixed": calculator.generate_mixed_tasks,
    "guess": guess.generate_tasks,
    "files": files.generate_tasks,
}


def make_environment(config: EnvConfig | Mapping[str, Any]) -> Environment:
    """The environment `config` names; a mapping is validated first (`ConfigError` on error)."""
    if isinstance(config, Mapping):
        config = parse_env_config(dict(config))
    if isinstance(config, ArithmeticEnvConfig):
        return ArithmeticEnvironment(config)
    if isinstance(config, ConciseEnvConfig):
        return ConciseEnvironment(config)
    if isinstance(config, CalculatorEnvConfig):
        return CalculatorEnvironment(config)
    if isinstance(config, GuessEnvConfig):
        return GuessEnvironment(config)
    if isinstance(config, FilesEnvConfig):
        return FilesEnvironment(config)
    if isinstance(config, ReasoningGymEnvConfig):
        from tracerl.envs.adapters.reasoning_gym import ReasoningGymEnvironment

        return ReasoningGymEnvironment(config)
    if isinstance(config, TextArenaEnvConfig):
        from tracerl.envs.adapters.textarena import TextArenaEnvironment

        return TextArenaEnvironment(config)
    if isinstance(config, VerifiersEnvConfig):
        from tracerl.envs.adapters.verifiers import VerifiersEnvironment

        return VerifiersEnvironment(config)
    if isinstance(config, OpenEnvEnvConfig):
        from tracerl.envs.adapters.openenv import OpenEnvEnvironment

        return OpenEnvEnvironment(config)
    if isinstance(config, CommandEnvConfig):
        return CommandEnvironment(config)
    if isinstance(config, ClaudeCodeEnvConfig):
        return ClaudeCodeEnvironment(config)
    if isinstance(config, CodexEnvConfig):
        return CodexEnvironment(config)
    raise TypeError(f"not an environment config: {config!r}")


def generate_tasks(name: str, num_tasks: int, seed: int) -> list[Task]:
    """`num_tasks` tasks of the built-in task `name`, the same for the same seed."""
    if name not in TASK_GENERATORS:
        raise ValueError(f"no task generator {name!r}; choose one of {sorted(TASK_GENERATORS)}")
    return TASK_GENERATORS[name](num_tasks, seed)
