"""Environments written for other frameworks, played through a gateway session unchanged:
reasoning-gym's generators, TextArena's games, verifiers environments and OpenEnv servers.

Each adapter imports its package only when its environment is made, so tracerl never needs them;
each installs with an extra of its own, and a missing package is one line naming it.
"""

from __future__ import annotations

from tracerl.config.base import ConfigError


def missing_extra(env_name: str, extra: str, error: ImportError) -> ConfigError:
    """The error for an environment whose package is not installed."""
    return ConfigError(
        f'env.name = "{env_name}" needs the {extra} package, which is not installed ({error}): '
        f"pip install 'tracerl[{extra}]'"
    )
