"""Weight versions: which weights sampled which tokens, written once.

- The weights after trainer step N are version N; the weights a run starts from are version 0.
- A turn's version is its oldest token's: `weight_version`, or `weight_version_min` when its
  generation was resumed across a weight update.
- A trajectory's (and an episode's, and a group's) version is the oldest of its turns'.
- Step N trains on samples while the weights are version N - 1, so a sample of version v is
  N - 1 - v versions stale there, and may be trained while that is at most
  `loop.max_off_policy_steps`.
"""

from __future__ import annotations

from collections.abc import Iterable

from tracerl.trace.schema import Turn


def turn_version(turn: Turn) -> int:
    """The oldest weights any of `turn`'s tokens came from."""
    return turn.weight_version if turn.weight_version_min is None else turn.weight_version_min


def oldest_version(turns: Iterable[Turn]) -> int:
    """The oldest weights any token of `turns` (a trajectory's) came from."""
    return min(turn_version(t) for t in turns)


def staleness(step: int, version: int) -> int:
    """How many weight versions behind the trainer a sample of `version` is at `step`."""
    return step - 1 - version


def oldest_trainable(step: int, max_off_policy_steps: int) -> int:
    """The oldest version step `step` may train on."""
    return step - 1 - max_off_policy_steps
