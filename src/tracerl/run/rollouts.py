"""Episodes and groups as the loop sees them: one episode = one gateway session, one
environment run, one trace read back from the store, and the training samples it yields.

`EpisodeRunner.run` opens a session over HTTP with the admin key (exactly as an external
orchestrator would), runs the environment under its timeout (here, or on an agent worker:
`play`), closes the session, reads the session's trace from the store and scores it when the
environment left the reward to its `reward_fn`. With several gateways, sessions open on each in
turn; one that cannot be reached is left out from then on. An episode whose agent worker was
lost (`PlayerLost`) is played again once, in a new session. Every recorded trajectory of the
session becomes a `TrainSample` carrying the episode's reward, the group id and the oldest
weight version among its turns. Failed episodes come back as records with their reason and no
samples. Each episode is an `episode` span (telemetry on; `tracerl.run.spans`), whose context
the session carries to the gateway (its requests' parent) and to external agents (`TRACEPARENT`).

`GroupBuffer` gathers the k episodes of each prompt; a group is ready when all of them ended.
Failed episodes are dropped from their group (counted); a group left with fewer than
`min_good` successful episodes is dropped (two for a group baseline, one for PPO, whose critic
learns from every reward, groups of one included). With `filter_uniform` (group baselines
waiting for signal) groups whose rewards are all equal are dropped too. Every dropped group is
reported to `on_drop` with its reason, so the loop can say why it never reached a step.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from tracerl.control.dispatcher import Dispatcher
from tracerl.envs import (
    Environment,
    EpisodeResult,
    Session,
    Task,
    TaskDataset,
    load_dataset,
    make_environment,
    run_episode,
    score_trace,
)  # fmt: skip
from tracerl.envs.episode import PlayerLost
from tracerl.gateway.store import TraceStore
from tracerl.run.spans import episode_attributes
from tracerl.telemetry import AttributeValue, Span, Telemetry
from tracerl.trace.schema import SessionTrace
from tracerl.trace.versions import oldest_version, staleness
from tracerl.train.batch import TrainSample

if TYPE_CHECKING:
    from tracerl.config import TrainCommandConfig

log = logging.getLogger(__name__)


def open_environment(
    config: TrainCommandConfig, closers: list[Any]
) -> tuple[Environment, TaskDataset, TaskDataset | None]:
    """The run's environment and its train and eval datasets (`generate = "env"` asks the
    environment for its splits); an environment's `close` (a server it started) goes on
    `closers`."""
    env = make_environment(config.env)
    if callable(close := getattr(env, "close", None)):
        closers.append(close)
    dataset = load_dataset(config.dataset, env.task_fields, env)
    held_out = config.eval_dataset
    eval_dataset = load_dataset(held_out, env.task_fields, env, "eval") if held_out else None
    if eval_dataset is not None and config.eval.by is not None:
        eval_dataset.check_field(config.eval.by, "eval.by")
    return env, dataset, eval_dataset


@dataclass
class Rollout:
    """One ended episode."""

    group: int
    kind: str
    result: EpisodeResult
    samples: list[TrainSample] = field(default_factory=list)
    tokens: int = 0
    """Sampled (completion) tokens."""
    version: int = 0
    """Oldest weight version that sampled any of its tokens."""
    session_id: str | None = None
    held_tokens: int = 0
    """The most KV the engines held for it: its longest turn's prompt plus completion (a
    multi-turn agent's context grows every turn). The controller's episode cost."""

    @property
    def ok(self) -> bool:
        return not self.result.failed and self.result.reward is not None and bool(self.samples)


def trace_samples(trace: SessionTrace, reward: float, group: int) -> tuple[list[TrainSample], int]:
    """Every trajectory of `trace` as a sample with `reward`; and the oldest weight version."""
    samples = []
    oldest: int | None = None
    for trajectory in trace.trajectories:
        turns = [trace.turns[i] for i in trajectory.turn_indices]
        if not turns or not any(trajectory.loss_mask):
            continue
        version = oldest_version(turns)
        oldest = version if oldest is None else min(oldest, version)
        samples.append(
            TrainSample.from_trajectory(
                trajectory, reward=reward, group_id=group, weight_version=version
            )
        )
    return samples, oldest or 0


def rollout_metrics(
    step: int, rollouts: Sequence[Rollout], samples: Sequence[TrainSample]
) -> dict[str, float]:
    """`rollout/*` (and `env_metrics`) of the episodes and samples step `step` trained on."""
    rewards = [r.result.reward for r in rollouts if r.result.reward is not None]
    stale = [staleness(step, s.weight_version) for s in samples]
    return {
        "rollout/reward_mean": statistics.fmean(rewards),
        "rollout/reward_std": statistics.pstdev(rewards),
        "rollout/episodes": len(rollouts),
        "rollout/samples": len(samples),
        "rollout/completion_tokens_mean": statistics.fmean(r.tokens for r in rollouts),
        "rollout/sample_tokens_mean": statistics.fmean(len(s.token_ids) for s in samples),
        "rollout/staleness_mean": statistics.fmean(stale),
        "rollout/staleness_max": max(stale),
        **env_metrics(rollouts),
    }


def dispatch_gauges(
    dispatcher: Dispatcher, step: int, admitted: dict[str, int]
) -> dict[str, float]:
    """In flight by kind, and how many weight versions the in-flight train episodes lag (each
    began on the weights of the step it was admitted at, `admitted[episode_id]`)."""
    kinds = dispatcher.inflight_by_kind()
    lags = [step - at for at in admitted.values()]
    return {
        "concurrency/inflight": float(dispatcher.inflight),
        "concurrency/inflight_train": float(kinds.get("train", 0)),
        "concurrency/inflight_eval": float(kinds.get("eval", 0)),
        "concurrency/offpolicy_max": float(max(lags, default=0)),
        "concurrency/offpolicy_mean": statistics.fmean(lags) if lags else 0.0,
    }


def env_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """`env/NAME`: the mean over `rollouts` of each metric their environment reported (the
    calculator's tool calls, a CLI agent's `agent_error` rate, an agent's own), over the
    episodes that reported it. And `rollout/one_trajectory_frac`: the share of episodes whose
    turns all form one trajectory (a multi-turn episode splits where its client rewrote the
    history, or its chat template did under `history = "template"`: each turn's
    `fork_reason` in the trace says why)."""
    values: dict[str, list[float]] = {}
    for rollout in rollouts:
        for name, value in rollout.result.metrics.items():
            values.setdefault(name, []).append(value)
    metrics = {f"env/{name}": statistics.fmean(v) for name, v in sorted(values.items())}
    ended = [r for r in rollouts if r.samples]
    if ended:
        metrics["rollout/one_trajectory_frac"] = statistics.fmean(
            len(r.samples) == 1 for r in ended
        )
    return metrics


Player = Callable[[Task, Session, float], Awaitable[EpisodeResult]]
"""Plays a task in a session for at most a timeout (`run_episode` here, or an agent worker)."""

DEMO = "demo"
"""The kind of an episode the environment's scripted policy plays (`Session.demonstration`)."""

REPLAYS = 1
"""Times an episode whose player was lost is played again."""


@dataclass(frozen=True)
class Play:
    """What an episode plays: its task, with the sampling parameters of its requests."""

    task: Task
    sampling: dict[str, Any]


def episode_seed(run_seed: int, index: int, sample: int) -> int:
    """The seed of sample `sample` of task `index` (a training group's, or an eval's task):
    its own per task and sample, so no two episodes of a run share their draws (sampled evals
    once all drew `loop.seed + sample`), and the same at every eval, so a curve compares the
    weights on the same draws. Later turns derive theirs from it (`envs.base.turn_seed`)."""
    return run_seed * 1_000_003 + index * 1_009 + sample


class EpisodeRunner:
    def __init__(
        self,
        env: Environment,
        gateway_urls: Sequence[str],
        admin_key: str,
        store: TraceStore,
        *,
        timeout_s: float,
        model: str = "policy",
        player: Player | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        """`player`: where episodes are played (default: in this process); `telemetry`: where
        episode spans go (default: off)."""
        self.telemetry = telemetry or Telemetry()
        self.env = env
        self.gateway_urls = list(gateway_urls)
        self.store = store
        self.timeout_s = timeout_s
        self.model = model
        self.counters: Counter[str] = Counter()
        self._player = player or self._play_here
        self._next = 0
        self._headers = {"Authorization": f"Bearer {admin_key}"}
        self._http: aiohttp.ClientSession | None = None

    async def _play_here(self, task: Task, session: Session, timeout_s: float) -> EpisodeResult:
        return await run_episode(self.env, task, session, timeout_s)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _post(self, url: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        async with self._http.post(f"{url}{path}", json=body or {}, headers=self._headers) as resp:
            payload = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"gateway {url}{path} answered {resp.status}: {payload}")
            return payload

    async def _open(
        self, group: int, kind: str, traceparent: str | None
    ) -> tuple[str, dict[str, Any]]:
        """A new session on the next gateway in turn: its URL and `POST /sessions` reply. A
        gateway that cannot be reached is left out (while another remains)."""
        body: dict[str, Any] = {"metadata": {"group": group, "kind": kind}}
        if traceparent is not None:  # the episode's span: parent of the session's requests
            body["traceparent"] = traceparent
        while True:
            url = self.gateway_urls[self._next % len(self.gateway_urls)]
            self._next += 1
            try:
                return url, await self._post(url, "/sessions", body)
            except aiohttp.ClientConnectionError as e:
                if len(self.gateway_urls) == 1:
                    raise
                self.gateway_urls.remove(url)
                self.counters["gateways_lost"] += 1
                log.error("gateway %s cannot be reached (%s): left out of rotation", url, e)

    async def run(self, task: Task, group: int, kind: str, sampling: dict[str, Any]) -> Rollout:
        """Play one episode; `sampling` overrides the environment's (a seed, eval settings)."""
        attributes: dict[str, AttributeValue | None] = {
            "tracerl.env.name": self.env.name,
            "tracerl.episode.group": group,
        }
        with self.telemetry.span("episode", attributes=attributes) as span:
            rollout = await self._run(task, group, kind, sampling, span)
            span.update(episode_attributes(rollout))
            if rollout.result.failed:
                span.fail(rollout.result.reason or "failed")
        return rollout

    async def _run(
        self,
        task: Task,
        group: int,
        kind: str,
        sampling: dict[str, Any],
        span: Span,
    ) -> Rollout:
        for attempt in range(REPLAYS + 1):
            url, reply = await self._open(group, kind, span.traceparent)
            session = Session.from_gateway(
                reply,
                model=self.model,
                sampling=sampling,
                traceparent=span.traceparent,
                demonstration=kind == DEMO,
            )
            span.set("tracerl.session.id", session.session_id)  # a cancelled episode's too
            try:
                result = await self._player(task, session, self.timeout_s)
                break
            except PlayerLost as e:
                self.counters["episodes_replayed"] += 1
                if attempt == REPLAYS:
                    result = EpisodeResult(None, failed=True, reason=str(e))
                    break
                log.warning("episode of group %d lost (%s): playing it again", group, e)
            finally:
                await self._post(url, f"/sessions/{session.session_id}/close")
        trace = await self.store.trace(session.session_id)
        if trace is None:  # the gateway always creates the session first: a store fault
            raise RuntimeError(f"session {session.session_id} has no trace in the store")
        if result.needs_trace_reward:
            result = score_trace(self.env, task, result, trace)
        if kind != DEMO and any(t.demonstration for t in trace.turns):
            result = EpisodeResult(
                None, result.metrics, failed=True, duration_s=result.duration_s,
                reason="the episode has demonstrated turns (not sampled): RL cannot train on them",
            )  # fmt: skip
        rollout = Rollout(group, kind, result, session_id=session.session_id)
        rollout.tokens = sum(len(t.completion_ids) for t in trace.turns)
        rollout.held_tokens = max(
            (len(t.prompt_ids) + len(t.completion_ids) for t in trace.turns), default=0
        )
        if not result.failed and result.reward is not None:
            rollout.samples, rollout.version = trace_samples(trace, result.reward, group)
            if not rollout.samples:  # an agent that failed before any reply says why
                reason = "the episode recorded no sampled tokens"
                rollout.result = EpisodeResult(
                    None,
                    result.metrics,
                    failed=True,
                    reason=f"{reason}: {result.error}" if result.error else reason,
                    duration_s=result.duration_s,
                )
        return rollout


@dataclass
class Group:
    group: int
    size: int
    rollouts: list[Rollout] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.rollouts) >= self.size

    @property
    def version(self) -> int:
        """Its oldest episode's weight version."""
        return min(r.version for r in self.rollouts)


class GroupBuffer:
    """Completed groups, ready for the trainer, in completion order."""

    def __init__(
        self,
        group_size: int,
        filter_uniform: bool,
        min_good: int = 2,
        on_drop: Callable[[Group, str], None] | None = None,
    ) -> None:
        self.group_size = group_size
        self.filter_uniform = filter_uniform
        self.min_good = min_good
        self.on_drop = on_drop or (lambda group, reason: None)
        self.pending: dict[int, Group] = {}
        self.ready: list[Group] = []
        self.counters: Counter[str] = Counter()
        self._cancelled: dict[int, int] = {}
        """Cancelled groups -> how many of their members have yet to report (then forgotten)."""

    def open(self, group: int) -> None:
        """A group's first episode was submitted: it is outstanding from now on."""
        self.pending.setdefault(group, Group(group, self.group_size))

    def add(self, rollout: Rollout) -> None:
        if rollout.group in self._cancelled:  # its other members were shed: it never completes
            self._reported(rollout.group)
            return
        group = self.pending.setdefault(rollout.group, Group(rollout.group, self.group_size))
        group.rollouts.append(rollout)
        if not rollout.ok:
            self.counters["episodes_failed"] += 1
            log.info("episode of group %d failed: %s", rollout.group, rollout.result.reason)
        if not group.done:
            return
        del self.pending[rollout.group]
        good = [r for r in group.rollouts if r.ok]
        if len(good) < self.min_good:
            self.counters["groups_dropped_failed"] += 1
            self.on_drop(group, f"{len(good)} of {len(group.rollouts)} episodes succeeded")
            return
        rewards = {r.result.reward for r in good}
        if self.filter_uniform and len(rewards) == 1:
            self.counters["groups_uniform"] += 1
            self.on_drop(group, "uniform rewards")
            return
        group.rollouts = good
        self.ready.append(group)

    def cancel(self, group: int) -> None:
        """A group whose episodes were cancelled (shed, or the loop stopping) never completes;
        its members that still finish are ignored. Called once per cancelled member: when every
        member has reported, the group is forgotten."""
        if group not in self._cancelled:
            pending = self.pending.pop(group, None)
            if pending is not None:
                self.counters["groups_cancelled"] += 1
            reported = len(pending.rollouts) if pending is not None else 0
            self._cancelled[group] = self.group_size - reported
        self._reported(group)

    def cancelled(self, group: int) -> bool:
        """Some member of `group` was cancelled: the group can never complete."""
        return group in self._cancelled

    def never_submitted(self, group: int, members: int) -> None:
        """`members` of a cancelled group will never run (the feeder stopped submitting them)."""
        self._reported(group, members)

    def _reported(self, group: int, members: int = 1) -> None:
        self._cancelled[group] -= members
        if self._cancelled[group] <= 0:
            del self._cancelled[group]

    def take(self, groups: int, min_version: int) -> list[Group]:
        """Up to `groups` ready groups whose every sample is at `min_version` or newer; staler
        ones are dropped and counted (async off-policy bound)."""
        taken: list[Group] = []
        while self.ready and len(taken) < groups:
            group = self.ready.pop(0)
            if group.version < min_version:
                self.counters["groups_stale"] += 1
                self.on_drop(group, "stale")
                continue
            taken.append(group)
        return taken

    def drop_stale(self, min_version: int) -> int:
        """Drop (and count) ready groups older than `min_version`: they can never be trained on,
        and must not hold the places of fresh ones."""
        fresh = []
        for group in self.ready:
            if group.version >= min_version:
                fresh.append(group)
            else:
                self.on_drop(group, "stale")
        dropped = len(self.ready) - len(fresh)
        self.ready = fresh
        self.counters["groups_stale"] += dropped
        return dropped

    def fresh_ready(self, min_version: int) -> int:
        return sum(1 for g in self.ready if g.version >= min_version)
