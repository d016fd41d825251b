"""Agent workers as Ray actors (`cluster.agents.workers`): where episodes are played, so the
environment, and any agent process or sandbox it starts, runs on the nodes
`cluster.agents.resources` names (CPU nodes apart from the accelerators) instead of the driver.

The driver still opens and closes each episode's session and reads its trace from the store;
a worker gets the task and the session (base URLs and key of a gateway it must reach) and runs
`tracerl.envs.run_episode` there, so an environment's failures and timeouts come back as the
same records as in one process. Episodes go to the worker with the fewest in flight.

A worker that dies (killed, or its node lost) is replaced by a new actor, and the episode it
was playing is raised as `PlayerLost`: the runner plays it again in a new session (the lost
one's turns stay in the store, untrained), so a lost worker costs time, not a rollout.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

from tracerl.cluster.ray_cluster import cause, import_ray, started
from tracerl.config.cluster import AgentWorkersConfig
from tracerl.envs import EpisodeResult, Session, Task
from tracerl.envs.episode import PlayerLost
from tracerl.eventloop import close_all

log = logging.getLogger(__name__)


class AgentWorker:
    """Plays episodes of one environment (a Ray actor, async: many at once)."""

    def __init__(self, env_config: Any) -> None:
        from tracerl.envs import make_environment

        self.env = make_environment(env_config)

    async def play(self, task: Task, session: Session, timeout_s: float) -> EpisodeResult:
        from tracerl.envs import run_episode

        return await run_episode(self.env, task, session, timeout_s)

    async def close(self) -> None:
        """What the environment holds for the run (a server it started), released."""
        if callable(close := getattr(self.env, "close", None)):
            await close_all([close], log)

    def where(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


@dataclass
class _Worker:
    index: int
    actor: Any
    inflight: int = 0
    placement: dict[str, Any] | None = None


class AgentWorkers:
    """The run's agent workers, from the driver: `play` is the episode runner's."""

    def __init__(self, env_config: Any, role: AgentWorkersConfig, ready_timeout_s: float):
        self.env_config = env_config
        self.role = role
        self.ready_timeout_s = ready_timeout_s
        self.workers: list[_Worker] = []
        self.restarts = 0
        self._placing: set[asyncio.Task[None]] = set()

    def _actor(self) -> Any:
        ray = import_ray()
        r = self.role
        return (
            ray.remote(AgentWorker)
            .options(
                num_cpus=r.num_cpus,
                num_gpus=r.num_gpus,
                resources=dict(r.resources),
                max_restarts=0,
                max_concurrency=1000,  # episodes wait on the gateway, not on this actor
            )
            .remote(self.env_config)
        )

    async def start(self) -> None:
        """Place the workers; `ConfigError` naming the role if they cannot be placed in
        `cluster.ready_timeout_s`, or if the environment fails to build there."""
        self.workers = [_Worker(i, self._actor()) for i in range(self.role.workers)]
        refs = [w.actor.where.remote() for w in self.workers]
        placed = await started(refs, "agents", "agent worker", self.role, self.ready_timeout_s)
        for worker, placement in zip(self.workers, placed, strict=True):
            worker.placement = placement
        log.info("%d agent worker(s) started", len(self.workers))

    async def play(self, task: Task, session: Session, timeout_s: float) -> EpisodeResult:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        worker = min(self.workers, key=lambda w: w.inflight)
        actor = worker.actor
        worker.inflight += 1
        try:
            result: EpisodeResult = await actor.play.remote(task, session, timeout_s)
            return result
        except (RayActorError, ActorDiedError, ActorUnavailableError) as e:
            reason = f"agent worker {worker.index} died: {cause(e)}"
            if worker.actor is actor:  # the first of its episodes to notice replaces it
                self._replace(worker, reason)
            raise PlayerLost(reason) from None
        finally:
            worker.inflight -= 1

    def _replace(self, worker: _Worker, reason: str) -> None:
        ray = import_ray()
        log.warning("%s; starting a new one", reason)
        ray.kill(worker.actor, no_restart=True)
        worker.actor, worker.placement = self._actor(), None
        self.restarts += 1
        task = asyncio.get_running_loop().create_task(self._placed(worker))
        self._placing.add(task)
        task.add_done_callback(self._placing.discard)

    async def _placed(self, worker: _Worker) -> None:
        try:
            worker.placement = await worker.actor.where.remote()
        except Exception as e:  # noticed again by the next episode it plays
            log.warning("agent worker %d did not start: %s", worker.index, cause(e))

    def records(self) -> list[dict[str, Any]]:
        return [
            {"index": w.index, "inflight": w.inflight, **(w.placement or {})} for w in self.workers
        ]

    def close(self) -> None:
        ray = import_ray()
        for task in self._placing:
            task.cancel()
        for worker in self.workers:
            try:  # the environment's own close first: a killed actor leaves its servers behind
                ray.get(worker.actor.close.remote(), timeout=30)
            except Exception as e:
                log.warning("agent worker %d: closing its environment failed: %s", worker.index, e)
            ray.kill(worker.actor, no_restart=True)
        self.workers = []
