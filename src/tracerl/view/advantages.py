"""The advantages a group's samples get, for the group page: the trainer's own
`tracerl.algo.advantages.group_advantages` over the group's successful episodes, with the
run's algorithm settings from `config.json` (torch loads on the first group shown).

PPO's advantages are per token (GAE over a learned critic's values), not one per sample, so a
PPO run's group page shows none and says why.
"""

from __future__ import annotations

from typing import Any


def group_advantages_of(
    members: list[dict[str, Any]], config: dict[str, Any] | None
) -> tuple[dict[str, float | None], str]:
    """Session id -> advantage for the group's `members` (episode lines), and a note saying how
    it was computed. Failed episodes are dropped from their group before training: none."""
    trainer = (config or {}).get("trainer") or {}
    algorithm = trainer.get("algorithm", "ppo")
    if algorithm not in ("grpo", "dr_grpo", "rloo"):
        return {}, f"{algorithm}: advantages are per token (GAE over the critic), not per sample"
    good = [m for m in members if not m.get("failed") and m.get("reward") is not None]
    if not good:
        return {}, "no successful episode in this group: nothing to train on"
    import torch

    from tracerl.algo.advantages import group_advantages

    rewards = torch.tensor([float(m["reward"]) for m in good], dtype=torch.float64)
    std_normalize = bool(trainer.get("std_normalize", True))
    values = group_advantages(
        rewards, torch.zeros(len(good), dtype=torch.long), algorithm, std_normalize
    )
    out: dict[str, float | None] = {
        str(m["session_id"]): float(v) for m, v in zip(good, values.tolist(), strict=True)
    }
    return out, (
        f"{algorithm} advantages over the group's {len(good)} successful episodes"
        + (" (std-normalised)" if algorithm == "grpo" and std_normalize else "")
        + ", as the trainer computes them"
    )
