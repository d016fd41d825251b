"""Configuration of where `tracerl train` runs its parts: in this process (`local`) or placed on
a Ray cluster (`ray`): trainer ranks, engine servers, gateways and agent workers. No torch, no
Ray here."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from tracerl.config.base import Config

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class RoleResources(Config):
    """What one actor of a role reserves on the cluster."""

    num_cpus: float = Field(default=1.0, ge=0)
    """CPUs reserved per actor (Ray's logical CPUs)."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs reserved per actor; a trainer rank or an engine with one runs on it."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources per actor, e.g. `{"trainer_node" = 1}` to place the role on nodes
    started with `ray start --resources '{"trainer_node": 8}'`."""


class TrainerRanksConfig(RoleResources):
    ranks: int = Field(default=1, ge=1, le=1024)
    """Trainer ranks: one torch process group (gloo on CPUs, nccl on GPUs) over which the
    actor, critic and reference are sharded with FSDP2. Each step's batch is split over them
    by whole groups, so a step needs at least this many trajectories."""
    strategy: Strategy = "PACK"
    """Ray placement-group strategy of the ranks: PACK (as few nodes as fit), SPREAD, or the
    STRICT_ forms, which fail instead of falling back."""


class GatewaysConfig(RoleResources):
    count: int = Field(default=0, ge=0, le=64)
    """Gateways placed as Ray actors; each episode's session opens on one of them in turn.
    0: the gateway runs in the driver. With the run's SQLite store they run on the driver's
    node (the file is that machine's); with `trace_store = "postgresql://..."`, anywhere."""


class AgentWorkersConfig(RoleResources):
    workers: int = Field(default=0, ge=0, le=1024)
    """Agent workers placed as Ray actors, where episodes are played: the environment (and any
    agent process it starts) runs there, against the session's gateway URL. 0: episodes play
    in the driver."""


class ClusterConfig(Config):
    backend: Literal["local", "ray"] = "local"
    """`local`: the trainer runs in this process and engines start beside it. `ray`: trainer
    ranks and engine servers run as Ray actors (install the `[ray]` extra)."""
    address: str | None = None
    """The Ray cluster: `auto` (the one `ray start` made on this machine), a GCS address
    `HOST:6379`, or `ray://HOST:10001`. Unset: start a private local cluster for this run,
    stopped when it ends."""
    num_cpus: int | None = Field(default=None, ge=1)
    """CPUs of the private local cluster (address unset); unset: all of this machine's."""
    trainer: TrainerRanksConfig = Field(default_factory=TrainerRanksConfig)
    """The trainer ranks and what each reserves."""
    engines: RoleResources = Field(default_factory=RoleResources)
    """What each engine server's actor reserves (`engine.count` of them; the engine's own
    flags, e.g. vLLM's tensor parallelism, are `engine.launch_args`)."""
    gateways: GatewaysConfig = Field(default_factory=GatewaysConfig)
    """The gateway actors and what each reserves."""
    agents: AgentWorkersConfig = Field(default_factory=AgentWorkersConfig)
    """The agent workers and what each reserves, e.g. `resources = {"cpu_node" = 1}` to keep
    agent sandboxes on CPU nodes apart from the accelerators."""
    weight_sync: Literal["object_store", "disk"] = "object_store"
    """How each step's weights reach the engine actors. `object_store`: rank 0 gathers the
    actor and puts it in Ray's object store; each engine actor writes it to its own node's
    disk and its server loads it there (no shared filesystem needed). `disk`: rank 0 writes
    `RUN_DIR/weights` and every server loads that path (a directory every node sees)."""
    bind: str = "127.0.0.1"
    """The interface engine actors and the gateways serve on. 127.0.0.1 reaches only the
    driver's own node; across machines set `0.0.0.0` (or the nodes' network), which needs
    `engine.api_key`. With a key, every engine sits behind a proxy on this interface that
    requires it; a gateway always requires its admin key and each session's key."""
    ready_timeout_s: float = Field(default=300.0, gt=0)
    """How long actors may wait for their resources (a placement group) before start-up fails
    naming the role."""

    @model_validator(mode="after")
    def _cpus_of_a_private_cluster(self) -> Self:
        if self.num_cpus is not None and self.address is not None:
            raise ValueError(
                "cluster.num_cpus sizes a private local cluster; with cluster.address the "
                "cluster's nodes have their own (`ray start --num-cpus`)"
            )
        return self

    @model_validator(mode="after")
    def _actors_need_ray(self) -> Self:
        if self.backend != "ray":
            for role, count in (("gateways.count", self.gateways.count),
                                ("agents.workers", self.agents.workers)):  # fmt: skip
                if count:
                    raise ValueError(
                        f"cluster.{role} is {count} but cluster.backend is 'local': these "
                        "actors are placed by Ray (cluster.backend = 'ray')"
                    )
        return self


def is_loopback(host: str) -> bool:
    """`host` is an address only this machine reaches."""
    return host in ("localhost", "::1") or host.startswith("127.")
