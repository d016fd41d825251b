"""Trajectory assembly: turns linked by exact token prefixes become training sequences.

A turn whose prompt extends its parent turn's `prompt_ids + completion_ids` continues the parent's
trajectory when the parent is that trajectory's last turn. When the parent already has a
continuation (the agent went back to an earlier state: a fork), the turn starts a new trajectory
whose prefix, up to and including the parent, is context only (`loss_mask` 0), so every sampled
token is trained exactly once. A turn without a parent starts a new trajectory.

`loss_mask` is 1 exactly on sampled completion tokens; `logprobs` holds their sampling
log-probabilities and 0.0 elsewhere. A mixture-of-experts model's routing (`routed_experts`,
recorded per turn over its whole prompt and completion) is assembled row by row beside the
tokens: each position keeps the routing of the first turn that recorded it (the one whose
sampling it describes), later turns fill in the positions that are new to them.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from tracerl.routing import RoutedExperts, fit, merge
from tracerl.trace.schema import SessionTrace, Trajectory, Turn


class TraceError(ValueError):
    """Turns that contradict themselves (a parent whose tokens the child does not extend)."""


def session_trace(
    session_id: str, status: Literal["open", "closed"], turns: list[Turn]
) -> SessionTrace:
    """A session's trace as the gateway serves it (`GET /sessions/{id}`): its turns and the
    trajectories they assemble into. Raises `TraceError` on contradictory turns."""
    return SessionTrace(
        session_id=session_id,
        status=status,
        turns=turns,
        trajectories=assemble_trajectories(turns),
    )


def assemble_trajectories(turns: list[Turn]) -> list[Trajectory]:
    by_index = {t.index: t for t in turns}
    trajectories: list[Trajectory] = []
    tail_of: dict[int, int] = {}  # turn index -> trajectory it is currently the last turn of
    routing: list[np.ndarray | None] = []  # per trajectory, as long as its tokens
    for turn in sorted(turns, key=lambda t: t.index):
        parent = by_index.get(turn.parent) if turn.parent is not None else None
        if parent is not None:
            prefix = parent.prompt_ids + parent.completion_ids
            if turn.prompt_ids[: len(prefix)] != prefix:
                raise TraceError(f"turn {turn.index} does not extend its parent {parent.index}")
        if parent is not None and parent.index in tail_of:
            position = tail_of.pop(parent.index)
            traj = trajectories[position]
            new_prompt = turn.prompt_ids[len(traj.token_ids) :]
        else:
            position = len(trajectories)
            traj = Trajectory(token_ids=[], loss_mask=[], logprobs=[], turn_indices=[])
            trajectories.append(traj)
            routing.append(None)
            new_prompt = turn.prompt_ids  # a fork's shared prefix is context here
        traj.token_ids += new_prompt + turn.completion_ids
        traj.loss_mask += [0] * len(new_prompt) + [1] * len(turn.completion_ids)
        traj.logprobs += [0.0] * len(new_prompt) + list(turn.completion_logprobs)
        traj.turn_indices.append(turn.index)
        tail_of[turn.index] = position
        recorded = turn.routed_experts.array() if turn.routed_experts is not None else None
        try:
            routing[position] = merge(routing[position], recorded)
        except ValueError as e:
            raise TraceError(f"turn {turn.index}: {e}") from None
    for traj, rows in zip(trajectories, routing, strict=True):
        if rows is not None:
            traj.routed_experts = RoutedExperts.of(fit(rows, len(traj.token_ids)))
    return trajectories
