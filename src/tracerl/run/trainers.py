"""Which trainer the run drives: the `Trainer` in this process (`cluster.backend = "local"`),
or its ranks placed on a Ray cluster (`"ray"`: `tracerl.cluster`), which the loop drives
through the same calls. Split from the loop; its start-up (`startup.py`) calls `build` first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracerl.config import TrainCommandConfig

if TYPE_CHECKING:
    from tracerl.cluster.trainer_group import RayTrainer
    from tracerl.train.trainer import Trainer

    AnyTrainer = Trainer | RayTrainer


def connect(config: TrainCommandConfig, closers: list[Any]) -> None:
    """On Ray: join (or start) the cluster and check it can hold every role, before anything
    is placed. Call from the main thread (Ray installs its signal handlers there)."""
    if config.cluster.backend != "ray":
        return
    from tracerl.cluster import ray_cluster

    cluster = config.cluster
    ray_cluster.connect(cluster)
    closers.append(ray_cluster.disconnect)
    engines = 0 if config.engine.urls else config.engine.count
    ray_cluster.check_capacity(
        {
            "trainer": (cluster.trainer.ranks, cluster.trainer),
            "engines": (engines, cluster.engines),
            "gateways": (cluster.gateways.count, cluster.gateways),
            "agents": (cluster.agents.workers, cluster.agents),
        }
    )


def build(config: TrainCommandConfig, closers: list[Any]) -> AnyTrainer:
    """The run's trainer (blocking: models load): in process, or its ranks on the cluster
    `connect` joined. What must be closed at the end goes on `closers`."""
    if config.cluster.backend != "ray":
        from tracerl.train.trainer import Trainer

        return Trainer(config.trainer)
    from tracerl.cluster.trainer_group import RayTrainer

    trainer = RayTrainer(config.trainer, config.cluster)
    closers.append(trainer.close)
    return trainer
