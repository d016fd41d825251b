"""The seam between the RL loop and what plays an episode: `Session`, `EnvResult`, `Environment`.

An environment gets a task (a JSON-like dict) and a gateway session (base URLs and key), plays the
episode by talking to the model through the gateway only, and returns a reward with optional
metrics. It never sees tokens: the gateway records them, and the loop reads the trace afterwards.
An environment that cannot score the episode itself (an external agent that prints no reward)
returns `reward=None`; the loop then scores the final trace with the environment's `reward_fn`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracerl.trace.schema import SessionTrace

Task = dict[str, Any]
"""One task: a JSON-serialisable dict whose fields each environment documents."""


@dataclass(frozen=True)
class Session:
    """A gateway session as `POST /sessions` returns it, plus what the loop wants sampled."""

    session_id: str
    api_key: str
    openai_base_url: str
    anthropic_base_url: str
    model: str = "policy"
    """The model name put in requests (the gateway serves its one model whatever the name)."""
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """Overrides of the environment's sampling config (`temperature`, `max_tokens`, `top_p`)."""
    traceparent: str | None = None
    """The episode's span as a W3C `traceparent` (telemetry on): external agents get it as
    `TRACEPARENT`, so their own spans join the episode's trace."""
    demonstration: bool = False
    """Play the environment's scripted policy: every reply is its demonstration
    (`tracerl.gateway.demonstrations`), recorded for supervised fine-tuning, never sampled."""

    @classmethod
    def from_gateway(
        cls,
        reply: Mapping[str, Any],
        *,
        model: str = "policy",
        sampling: Mapping[str, Any] | None = None,
        traceparent: str | None = None,
        demonstration: bool = False,
    ) -> Session:
        """Build from the JSON body of `POST /sessions`."""
        return cls(
            session_id=reply["session_id"],
            api_key=reply["api_key"],
            openai_base_url=reply["openai_base_url"],
            anthropic_base_url=reply["anthropic_base_url"],
            model=model,
            sampling=dict(sampling or {}),
            traceparent=traceparent,
            demonstration=demonstration,
        )


@dataclass(frozen=True)
class EnvResult:
    """What an environment returns; `reward=None` asks the loop to score the trace instead."""

    reward: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    """The agent ended with this error, and its run was scored all the same (a CLI that
    stopped on the model's own reply); an episode that recorded nothing fails with it."""


class TraceReward(Protocol):
    """A reward over a finished episode's trace (`GET /sessions/{id}`), given its task."""

    def __call__(self, task: Task, trace: SessionTrace) -> float: ...


class Environment(Protocol):
    """Plays one episode of a task through a gateway session.

    Implementations are async because the loop runs hundreds of episodes at once: every network
    call goes through an async client, with no retries of its own (the engine pool retries; an SDK
    retry would record a turn twice) and an explicit timeout. Cancelling `run` must stop all the
    episode's work, including any process it started.

    An environment with a scripted policy (calculator, guess, files) also sets `demonstrable =
    True` and, when `session.demonstration` is set, sends that policy's replies as demonstrations
    (`tracerl.gateway.demonstrations`): what a cold start (`[cold_start]`) records.

    An environment that brings its own tasks (reasoning-gym's generators, a verifiers
    environment's dataset) also has `tasks(split, num_tasks, seed) -> list[Task]`: the tasks of
    `split` ("train", "eval", or a split of its own; `num_tasks` None: its own count), the same
    for the same arguments. `dataset.generate = "env"` reads them. One that holds something
    for the run's length (a server it started) has `close()` (sync or async), which the loop
    calls at the end.
    """

    @property
    def name(self) -> str:
        """The registry name ("arithmetic", "calculator", "guess", "files", "command", ...)."""
        ...

    @property
    def task_fields(self) -> tuple[str, ...]:
        """Fields every task must have; datasets check them row by row when loading."""
        ...

    @property
    def reward_fn(self) -> TraceReward | None:
        """Scores the trace when `run` returns `reward=None`; None if `run` always scores."""
        ...

    async def run(self, task: Task, session: Session) -> EnvResult: ...


def turn_seed(sampling: Mapping[str, Any], turn: int) -> dict[str, Any]:
    """`sampling` for an episode's model turn `turn` (0 first): a seeded episode's later turns
    get seeds of their own, derived from its seed. Every request with one seed draws the same
    random numbers, so an episode that sent its seed with every turn sampled each turn with
    the same draws: where one turn took an unlikely token, the others tended to as well."""
    seed = sampling.get("seed")
    if seed is None or turn == 0:
        return dict(sampling)
    return {**sampling, "seed": (int(seed) * 1_000_003 + turn) % 2**62}


def sampling_params(defaults: Mapping[str, Any], session: Session) -> dict[str, Any]:
    """The request's sampling fields: the config's defaults (unset ones dropped) under the
    session's overrides."""
    merged = {k: v for k, v in defaults.items() if v is not None}
    merged.update(session.sampling)
    return merged
