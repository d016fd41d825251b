"""The trace schema of ARCHITECTURE.md (`GET /sessions/{id}`), as pydantic models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracerl.routing import RoutedExperts

Endpoint = Literal["chat.completions", "messages", "responses"]
TurnFinish = Literal["stop", "length", "tool_calls", "abort"]


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0)
    endpoint: Endpoint
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    finish_reason: TurnFinish
    weight_version: int
    weight_version_min: int | None = None
    """Set when the turn's tokens span a weight update (a resumed generation): the oldest."""
    adapter: str | None = None
    """The LoRA adapter that sampled the turn (its versions are `weight_version`); None: the
    model's own weights."""
    client_disconnected: bool = False
    request: dict[str, Any]
    response: dict[str, Any]
    parent: int | None = None
    """Index of the turn whose `prompt_ids + completion_ids` this prompt extends, if any."""
    bridged: bool = False
    """The chat template renders the parent's reply differently than it was sampled (a
    thinking template dropping its reasoning): the prompt is the parent's tokens followed by
    the template's rendering of the messages after that reply (`gateway.history = "extend"`)."""
    fork_reason: str | None = None
    """Why this turn starts a new trajectory although its session has earlier turns."""
    demonstration: bool = False
    """The reply was the client's (a scripted policy's demonstration), not sampled: its
    tokens are the chat template's rendering of it, its log-probs 0.0. For supervised
    fine-tuning; RL never trains on it."""
    routed_experts: RoutedExperts | None = None
    """A mixture-of-experts model's routing of `prompt_ids + completion_ids` (shape `[T, L,
    k]`, the last row unrecorded; `tracerl.routing`), when the gateway recorded it."""
    max_new_tokens: int | None = None
    """The token budget the engine was given: the request's, or less when it was capped to the
    room the context had left (`gateway.max_tokens_policy = "cap"`); None: the engine's own."""


class Trajectory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turn_indices: list[int]
    routed_experts: RoutedExperts | None = None
    """The routing of `token_ids`, row by row (`tracerl.routing`): each position's from the
    first of its turns that recorded it; None when no turn did."""


class SessionTrace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    status: Literal["open", "closed"]
    turns: list[Turn]
    trajectories: list[Trajectory]
