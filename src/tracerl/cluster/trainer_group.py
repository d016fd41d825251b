"""The trainer ranks as Ray actors: one `Trainer` per rank inside one torch process group (gloo
on CPUs, nccl on GPUs), the models sharded with FSDP2 (`tracerl.train.shard`).

`RayTrainer` is what the loop drives in place of a `Trainer`: the same `step`, checkpoint and
export calls, each made on every rank with the same arguments (the whole batch goes through
Ray's object store once), rank 0's result returned. The ranks are placed by one placement group
(`cluster.trainer.strategy`), rank 0 on its first bundle; rank 0's node hosts the process
group's rendezvous.

A rank that dies (or raises) fails the call on every rank: the group is torn down, since its
peers would wait in a collective until gloo's timeout, and `TrainerRankError` says which rank
and what happened. The run stops there; `--resume` continues from its last checkpoint.
Checkpoints are written by the ranks, so their directory must be one every rank's node sees
(one machine, or a shared filesystem). Weights for the engines go through the object store
(`publish_weights`, `tracerl.cluster.weights`) or, with `cluster.weight_sync = "disk"`, through
`export` to the run directory.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from tracerl.cluster.ray_cluster import (
    cause,
    cpu_threads,
    import_ray,
    reservation,
    wait_placed,
)
from tracerl.cluster.weights import Packer, WeightsChannel
from tracerl.config.cluster import ClusterConfig
from tracerl.config.train import TrainerConfig
from tracerl.run.metrics import OPTIMIZER_GIB, optimizer_memory
from tracerl.train.checkpoint import CheckpointError

log = logging.getLogger(__name__)

SETUP_TIMEOUT_S = 300.0
"""A rank's share of forming the process group and loading its models."""


class TrainerRankError(RuntimeError):
    """A trainer rank died or failed; the message names it. The group is gone."""


class TrainerRank:
    """One rank (a Ray actor): joins the process group, then holds a `Trainer`."""

    def __init__(self, config: dict[str, Any], rank: int, world_size: int, threads: int) -> None:
        self.config = TrainerConfig.model_validate(config)
        self.rank, self.world_size = rank, world_size
        torch.set_num_threads(threads)
        self.trainer: Any = None
        self.packer = Packer()

    def rendezvous(self) -> str:
        """`host:port` on this node for the process group's store (rank 0 only)."""
        import ray

        from tracerl.rollout.backends import free_port

        host = ray.util.get_node_ip_address()
        return f"{host}:{free_port(host)}"

    def setup(self, address: str, timeout_s: float) -> dict[str, Any]:
        import ray

        from tracerl.models import resolve_model
        from tracerl.train.shard import join_process_group
        from tracerl.train.trainer import Trainer

        resolve_model(self.config.model)  # before the group: transformers saves on rank 0 only
        join_process_group(address, self.rank, self.world_size, timeout_s=timeout_s)
        self.trainer = Trainer(self.config)
        return {
            "rank": self.rank,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "device": str(self.trainer.device),
        }

    def step(self, samples: list[Any]) -> dict[str, float]:
        metrics: dict[str, float] = self.trainer.step(samples)
        return {**metrics, **optimizer_memory(self.trainer)}

    def save_checkpoint(self, directory: str, loop_state: Any) -> str:
        return str(self.trainer.save_checkpoint(directory, loop_state))

    def load_checkpoint(self, path: str) -> Any:
        return self.trainer.load_checkpoint(path)

    def export(self, path: str) -> str:
        return str(self.trainer.export(path))

    def probe_logprobs(self, token_ids: list[int], prompt_len: int) -> list[float]:
        return self.trainer.probe_logprobs(token_ids, prompt_len)

    def probe_suspects(
        self, token_ids: list[int], prompt_len: int, engine_logprobs: list[float]
    ) -> list[str]:
        return self.trainer.probe_suspects(token_ids, prompt_len, engine_logprobs)

    def pack_weights(self) -> list[Any] | None:
        """Every rank gathers; rank 0 puts the engines' files in the object store:
        `[reference]` (a list, so the caller gets the reference, not the bytes)."""
        import ray

        package = self.packer.package(self.trainer, self.rank)
        return [ray.put(package)] if package is not None else None

    def pack_adapter(self) -> list[Any]:
        """The LoRA adapter in the object store (one rank: LoRA trains on one):
        `[reference, bytes]`."""
        import ray

        from tracerl.cluster.weights import pack_adapter

        package = pack_adapter(self.trainer)
        return [ray.put(package), sum(len(data) for data in package.files.values())]

    def write_adapter(self, path: str) -> str:
        return str(self.trainer.write_adapter(Path(path)))

    def step_count(self) -> int:
        return int(self.trainer.step_count)


class RayTrainer:
    """A `Trainer` to the loop, whose ranks are Ray actors (see the module docstring)."""

    def __init__(self, config: TrainerConfig, cluster: ClusterConfig) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from tracerl.models import load_tokenizer, resolve_model

        ray = import_ray()
        self.config = config
        role = cluster.trainer
        self.world_size = role.ranks
        self.group = placement_group([reservation(role)] * role.ranks, strategy=role.strategy)
        wait_placed(self.group, "trainer", cluster.ready_timeout_s)
        options: dict[str, Any] = {
            "num_cpus": role.num_cpus,
            "num_gpus": role.num_gpus,
            "max_restarts": 0,
        }
        remote = ray.remote(TrainerRank)
        threads = cpu_threads(role)
        self.ranks = [
            remote.options(
                **options,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=i
                ),
            ).remote(config.model_dump(mode="json"), i, role.ranks, threads)
            for i in range(role.ranks)
        ]
        try:
            address = ray.get(self.ranks[0].rendezvous.remote(), timeout=SETUP_TIMEOUT_S)
            self.placement = self._all("setup", address, SETUP_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        self.device = torch.device(self.placement[0]["device"])
        self.tokenizer = load_tokenizer(resolve_model(config.model), config.chat_template)
        self.step_count = 0
        self.weights = WeightsChannel() if cluster.weight_sync == "object_store" else None
        log.info(
            "trainer: %d rank(s) on %s", role.ranks, [p["node_id"][:8] for p in self.placement]
        )

    def _all(self, method: str, *args: Any) -> list[Any]:
        """`method(*args)` on every rank; their results in rank order. The first failure
        tears the group down and raises `TrainerRankError` naming the rank."""
        ray = import_ray()
        refs = [getattr(rank, method).remote(*args) for rank in self.ranks]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except Exception as e:
                self.close()
                if isinstance(e, CheckpointError):  # the same on every rank: not the rank's
                    raise CheckpointError(cause(e)) from e
                raise TrainerRankError(
                    f"trainer rank {index[done[0]]} failed in {method}: {cause(e)}; the trainer "
                    "group is stopped (resume the run with --resume)"
                ) from e
        return list(ray.get(refs))

    def step(self, samples: list[Any]) -> dict[str, float]:
        ray = import_ray()
        per_rank = self._all("step", ray.put(list(samples)))
        metrics: dict[str, float] = dict(per_rank[0])
        if all(OPTIMIZER_GIB in m for m in per_rank):  # each rank holds its own shard
            metrics[OPTIMIZER_GIB] = sum(m[OPTIMIZER_GIB] for m in per_rank)
        self.step_count += 1
        return metrics

    def save_checkpoint(self, directory: str | Path, loop_state: Any = None) -> Path:
        return Path(self._all("save_checkpoint", str(directory), loop_state)[0])

    def load_checkpoint(self, path: str | Path) -> Any:
        loop_state = self._all("load_checkpoint", str(path))[0]
        self.step_count = self._all("step_count")[0]
        return loop_state

    def export(self, path: str | Path) -> Path:
        return Path(self._all("export", str(path))[0])

    def probe_logprobs(self, token_ids: list[int], prompt_len: int) -> list[float]:
        return list(self._all("probe_logprobs", list(token_ids), prompt_len)[0])

    def probe_suspects(
        self, token_ids: list[int], prompt_len: int, engine_logprobs: list[float]
    ) -> list[str]:
        return list(self._all("probe_suspects", list(token_ids), prompt_len, engine_logprobs)[0])

    def publish_weights(self, version: int) -> str:
        """The actor's weights in the object store, named in `self.weights` (the path to give
        the engine pool)."""
        assert self.weights is not None, "cluster.weight_sync is 'disk'"
        (ref,) = self._all("pack_weights")[0]
        return self.weights.publish(version, ref)

    def publish_adapter(self, version: int) -> tuple[str, int]:
        """The LoRA adapter in the object store, named in `self.weights`: that name (the
        adapter's path to give the engine pool) and the package's bytes."""
        assert self.weights is not None, "cluster.weight_sync is 'disk'"
        ref, nbytes = self._all("pack_adapter")[0]
        return self.weights.publish(version, ref, adapter=True), int(nbytes)

    def write_adapter(self, path: Path) -> Path:
        """The LoRA adapter in peft's layout at `path`, written by the rank (on its node: a
        filesystem the engines share, `cluster.weight_sync = "disk"`)."""
        return Path(self._all("write_adapter", str(path))[0])

    def adapter_weights(self) -> None:
        """Ray ranks push through the object store or an export, never in process."""
        return None

    def actor_named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        raise NotImplementedError(
            "trainer ranks on Ray push weights through the object store or export (served "
            "engines), not in process"
        )

    def close(self) -> None:
        """Kill the ranks and free their placement group (idempotent)."""
        from ray.util.placement_group import remove_placement_group

        ray = import_ray()
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
        self.ranks = []
        if self.group is not None:
            remove_placement_group(self.group)
            self.group = None
