"""The RL loop's start-up: the parts `RLLoop` runs, built in order on a running event loop.

`LoopStartup._start` builds, each from the ones before it: telemetry (first, so it closes last
and flushes every span the others end), the trainer (and on `--resume` its newest checkpoint
with the loop's saved state), the weight probe, the engines behind the pool, the store and the
gateway, the episodes' side (environment, datasets at their saved position, runner, group
buffer), the dispatcher with the adaptive concurrency controller and the metrics collector, and
the logs with the evals. Every part that must close is added to `closers`, which the loop closes
in reverse whatever happens.

It owns building and restoring the parts, not running them: the feeder, the steps and shutdown
are in `loop.py`, which supplies the callbacks the parts are wired to (declared abstract here).
"""

from __future__ import annotations

import abc
import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracerl.cluster import status as cluster_status
from tracerl.config import ConfigError
from tracerl.config.run import TrainCommandConfig
from tracerl.control.collector import MetricsCollector
from tracerl.control.controller import ConcurrencyController
from tracerl.control.dispatcher import Dispatcher, Episode, Finished
from tracerl.run import engines, gateways, probe, trainers
from tracerl.run.episode_log import EpisodeLog
from tracerl.run.evals import Evals
from tracerl.run.metrics import MetricsLog, Progress, truncate_metrics
from tracerl.run.rollouts import EpisodeRunner, Group, GroupBuffer, Rollout, open_environment
from tracerl.telemetry import Telemetry, start_telemetry

if TYPE_CHECKING:  # torch and the servers load in _start, after the config is checked
    from tracerl.envs import Environment
    from tracerl.envs.dataset import TaskDataset
    from tracerl.gateway.store import TraceStore
    from tracerl.rollout.pool import EnginePool
    from tracerl.run.gateways import Gateways
    from tracerl.run.probe import Probe
    from tracerl.run.rollouts import Player
    from tracerl.run.trainers import AnyTrainer

log = logging.getLogger(__name__)


class LoopStartup(abc.ABC):
    # Set by the loop before start-up.
    config: TrainCommandConfig
    run_dir: Path
    resume: bool
    step: int  # 0, or the step a resumed run continues from
    closers: list[Any]
    _given_engines: dict[str, Any] | None

    # Built by `_start`, in the order of the module docstring.
    telemetry: Telemetry
    trainer: AnyTrainer
    probe: Probe | None  # the weight probe; None where it is off
    pool: EnginePool
    gateways: Gateways
    store: TraceStore
    player: Player | None  # where episodes play (None: here)
    agent_workers: Any  # AgentWorkers on Ray, or None
    env: Environment
    dataset: TaskDataset
    eval_dataset: TaskDataset | None
    runner: EpisodeRunner
    buffer: GroupBuffer
    _group_counter: int  # groups submitted so far (saved in checkpoints)
    dispatcher: Dispatcher
    controller: ConcurrencyController
    collector: MetricsCollector
    metrics: MetricsLog
    episode_log: EpisodeLog
    progress: Progress
    evals: Evals

    async def _start(self) -> None:
        self.telemetry = start_telemetry(self.config.telemetry)
        self.closers.append(self.telemetry.close)
        trainers.connect(self.config, self.closers)  # Ray, when placed there: nothing runs yet
        self.trainer = await asyncio.to_thread(trainers.build, self.config, self.closers)
        loop_state = await self._resume() if self.resume else {}
        self.probe = None if self._given_engines else probe.probe_for(self.config, self.trainer)
        self.pool = await engines.start(
            self.config, self._given_engines, self.trainer, self.run_dir, self.step, self.closers,
            self.telemetry,
        )  # fmt: skip
        if self.probe is not None:  # the engines hold the weights they start on
            await probe.check(self.pool, self.trainer, self.probe, self.step)
        self._record_cluster()
        await self._start_gateway()
        self.episode_log = EpisodeLog(self.run_dir)  # for `tracerl view`
        self.closers.append(self.episode_log.close)
        self._start_episodes(loop_state)
        await self._start_control(loop_state)
        c = self.config
        self.metrics = MetricsLog(self.run_dir, c.logging, c.model_dump(mode="json"))
        self.closers.append(self.metrics.close)
        self.progress = Progress(c.loop.steps, c.logging.progress)
        self.evals = Evals(
            c, self.env.name, self.eval_dataset, self.dispatcher, self.metrics, self.progress
        )
        print(
            f"tracerl train: {c.trainer.algorithm} on {c.trainer.model}, env {self.env.name}, "
            f"{c.loop.steps} steps of {c.orchestrator.batch_size} trajectories "
            f"(groups of {c.orchestrator.group_size}), run dir {self.run_dir}, "
            f"gateway {' '.join(self.gateways.urls)}"
            + (f", resumed at step {self.step}" if self.step else ""),
            flush=True,
        )

    async def _resume(self) -> dict[str, Any]:
        """The trainer at its newest checkpoint; the loop's saved state."""
        from tracerl.train.checkpoint import CheckpointError

        try:
            state = await asyncio.to_thread(
                self.trainer.load_checkpoint, self.run_dir / "checkpoints"
            )
        except CheckpointError as e:  # a different config, or a torn write: never partial
            raise ConfigError(f"--resume: {e}") from None
        loop_state = state if isinstance(state, dict) else {}
        self.step = int(loop_state.get("step", self.trainer.step_count))
        dropped = truncate_metrics(self.run_dir / "metrics.jsonl", self.step)
        log.info("resumed at step %d (%d later metric lines dropped)", self.step, dropped)
        return loop_state

    async def _start_gateway(self) -> None:
        self.gateways = await gateways.start(
            self.config, self.pool, self.trainer.tokenizer, self.run_dir, self.closers,
            self.telemetry,
        )  # fmt: skip
        self.store = self.gateways.store
        self.player, self.agent_workers = await gateways.players(self.config, self.closers)

    def _start_episodes(self, loop_state: dict[str, Any]) -> None:
        c = self.config
        self.env, self.dataset, self.eval_dataset = open_environment(c, self.closers)
        if "dataset" in loop_state:
            self.dataset.load_state_dict(loop_state["dataset"])
        self.runner = EpisodeRunner(
            self.env,
            self.gateways.urls,
            self.gateways.admin_key,
            self.store,
            timeout_s=c.loop.episode_timeout_s,
            model=c.trainer.model,
            player=self.player,
            telemetry=self.telemetry,
        )
        self.closers.append(self.runner.close)
        ppo = c.trainer.algorithm == "ppo"
        self.buffer = GroupBuffer(
            c.orchestrator.group_size,
            filter_uniform=not ppo and c.trainer.filter_uniform_groups,
            min_good=1 if ppo else 2,  # a critic learns from one episode; a baseline needs two
            on_drop=self._record_group,
        )
        self.buffer.counters.update(loop_state.get("buffer", {}))
        self._group_counter = int(loop_state.get("groups", 0))

    async def _start_control(self, loop_state: dict[str, Any]) -> None:
        concurrency = self.config.orchestrator.concurrency
        self.dispatcher = Dispatcher(
            self._run_episode,
            cap=concurrency.initial_inflight or concurrency.min_inflight,
            group_size=self.config.orchestrator.group_size,
            on_complete=self._on_complete,
            never_shed=frozenset({"eval"}),  # an eval measures every task it was given
        )
        self.controller = ConcurrencyController(
            concurrency,
            set_limit=self.dispatcher.set_limit,
            on_overload=self.dispatcher.shed,
            get_inflight=lambda: self.dispatcher.inflight,
            get_eval_share=self.dispatcher.eval_share,
        )
        self.collector = MetricsCollector(
            self.pool.engines,
            self.controller.observe,
            interval_s=concurrency.poll_interval_s,
            timeout_s=concurrency.poll_timeout_s,
        )
        if "controller" in loop_state:  # continue at the cap the run had reached
            self.controller.load_state_dict(loop_state["controller"])
        await self.collector.poll_once()  # capacity first: the bootstrap needs it
        self.collector.start()
        self.closers.append(self.collector.stop)

    def _record_cluster(self) -> dict[str, float]:
        """What runs where now, in RUN_DIR/cluster.json; its gauges for the metrics line."""
        record = cluster_status.snapshot(self.config.cluster.backend, self.trainer, self.pool)
        if hasattr(self, "runner"):  # from the step on
            record.update(
                cluster_status.places(self.gateways, self.agent_workers, self.runner.counters)
            )
        cluster_status.write(self.run_dir, record)
        return cluster_status.gauges(record)

    # ------------------------------------------------------------------ the loop's callbacks

    @abc.abstractmethod
    async def _run_episode(self, episode: Episode) -> tuple[Rollout, int]:
        """The dispatcher's worker: one episode, and its cost to the controller."""

    @abc.abstractmethod
    def _on_complete(self, result: Finished) -> None:
        """The dispatcher's callback for every ended episode."""

    @abc.abstractmethod
    def _record_group(self, group: Group, outcome: str, step: int | None = None) -> None:
        """The group buffer's callback for a group that ended without being trained on."""
