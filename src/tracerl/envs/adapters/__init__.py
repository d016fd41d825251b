"""Environments written for other frameworks, played through a gateway session unchanged:
reasoning-gym's generators, TextArena's games, verifiers environments and OpenEnv servers.

Each adapter imports its package only when its environment is made, so tracerl never needs them;
each installs with an extra of its own, and a missing package is one line naming it.
"""

from __future__ import annotations

import random

from tracerl.config.base import ConfigError
from tracerl.envs.base import Task

SEEDED_TRAIN, SEEDED_EVAL = 1000, 50  # `seeded_tasks`' sizes when dataset.num_tasks is unset


def missing_extra(env_name: str, extra: str, error: ImportError) -> ConfigError:
    """The error for an environment whose package is not installed."""
    return ConfigError(
        f'env.name = "{env_name}" needs the {extra} package, which is not installed ({error}): '
        f"pip install 'tracerl[{extra}]'"
    )


def seeded_tasks(env_name: str, split: str, num_tasks: int | None, seed: int) -> list[Task]:
    """`{"seed": N}` tasks for an environment whose episodes a seed sets up (a game, a server's
    reset): `num_tasks` of them (1000 for `train`, 50 otherwise when unset), seeds drawn from
    the environment's and the split's names and `seed`, so splits do not share seeds."""
    size = num_tasks or (SEEDED_TRAIN if split == "train" else SEEDED_EVAL)
    rng = random.Random(f"tracerl.{env_name}:{split}:{seed}")
    return [{"seed": s} for s in rng.sample(range(2**31), size)]
