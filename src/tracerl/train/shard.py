"""Data parallelism over a torch process group: which samples each rank trains on, FSDP2
sharding of the trainer's models, and the lockstep that keeps the ranks' collectives matched.

Every rank's `Trainer.step` is given the whole batch (it is small: token ids and floats). Each
rank trains on its `Shard`: whole groups, balanced by tokens, the same split on every rank
(`Shard.split`). Per-batch statistics (loss denominators, whitening, metrics) already reduce over
the process group (`tracerl.algo.distributed`), and what needs every sample (group baselines,
the mini-batch shuffle) is computed from the whole batch on every rank, so a step on N ranks
makes the update one rank makes on the same batch, up to float summation order.

The models are sharded with FSDP2 (`fully_shard`): each decoder layer (the model's
`_no_split_modules` classes) is a unit, then the root. Gradients are **summed** over ranks, not
averaged as FSDP does by default: each rank's loss is already divided by the global
denominator, so the batch's gradient is the sum of the ranks' gradients.

FSDP's forwards and backwards are collectives: every rank must run the same number of them.
Ranks whose shard needs fewer micro-batches run `padding_micro_batch` forwards (and zero-loss
backwards) to make up the count (`Shard.padding`).

One process (no process group, or a group of one) is the identity shard: nothing is sharded,
nothing is padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tracerl.algo.distributed import all_reduce_max
from tracerl.train.batch import Batching, MicroBatch, PackedBatch, TrainSample, micro_batches


class ShardError(ValueError):
    """A batch or a model that cannot be split over the process group's ranks."""


def join_process_group(
    address: str, rank: int, world_size: int, backend: str | None = None, timeout_s: float = 300
) -> None:
    """Join the trainer ranks' process group whose rank 0 listens at `address` (`host:port`):
    nccl on CUDA, gloo on the CPU. A rank missing for `timeout_s` fails every collective."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def world() -> tuple[int, int]:
    """`(rank, world_size)` of the default process group; `(0, 1)` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclass(frozen=True)
class Shard:
    """The samples of a step's batch that this rank trains on.

    `owned`: indices into the whole batch, in the order of this rank's local batch; `total`:
    the whole batch's size.
    """

    rank: int
    world_size: int
    owned: list[int]
    total: int
    local_of: dict[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "local_of", {g: i for i, g in enumerate(self.owned)})

    @classmethod
    def whole(cls, size: int) -> Shard:
        """One process's shard: the whole batch."""
        return cls(0, 1, list(range(size)), size)

    @classmethod
    def split(cls, samples: Sequence[TrainSample], rank: int, world_size: int) -> Shard:
        """Whole groups to ranks, largest first, each to the rank with the fewest tokens so far
        (ties: the lowest rank), so the split is the same on every rank. With fewer groups than
        ranks, samples are split one by one the same way."""
        if world_size == 1:
            return cls.whole(len(samples))
        if len(samples) < world_size:
            raise ShardError(
                f"a step of {len(samples)} trajectories cannot be split over {world_size} trainer "
                "ranks: give each rank at least one (a larger batch, or fewer ranks)"
            )
        units: dict[int, list[int]] = {}
        for i, s in enumerate(samples):
            units.setdefault(s.group_id, []).append(i)
        members = list(units.values())
        if len(members) < world_size:
            members = [[i] for i in range(len(samples))]
        tokens = [sum(len(samples[i].token_ids) for i in unit) for unit in members]
        load = [0] * world_size
        mine: list[int] = []
        for u in sorted(range(len(members)), key=lambda u: (-tokens[u], members[u][0])):
            target = min(range(world_size), key=lambda r: (load[r], r))
            load[target] += tokens[u]
            if target == rank:
                mine += members[u]
        return cls(rank, world_size, sorted(mine), len(samples))

    def localize(self, parts: list[list[int]]) -> list[list[int]]:
        """Mini-batches of whole-batch indices as this rank's local indices (its share of
        each; possibly empty)."""
        return [[self.local_of[g] for g in part if g in self.local_of] for part in parts]

    def padding(
        self, mbs: Sequence[MicroBatch], device: torch.device, batching: Batching
    ) -> list[MicroBatch]:
        """The forwards this rank adds to `mbs` so that every rank makes as many as the rank
        with the most (a collective: call before any of them)."""
        if self.world_size == 1:
            return []
        most = int(all_reduce_max(torch.tensor([len(mbs)], dtype=torch.int64)).item())
        return [padding_micro_batch(device, batching)] * (most - len(mbs))


def local_nbytes(tensor: torch.Tensor) -> int:
    """Bytes of `tensor` this process holds: its own shard of a DTensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return int(local.numel() * local.element_size())


def padding_micro_batch(device: torch.device, batching: Batching) -> MicroBatch:
    """A two-token sample with one action: the forward a rank makes only so that its peers'
    collectives have a partner. Its outputs are discarded and its loss is multiplied by 0."""
    sample = TrainSample([0, 0], [0, 1], [0.0, -1.0], 0.0, 0, 0)
    batch = PackedBatch.build([sample], device)
    return micro_batches(batch, [0], 8, batching)[0]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the modules of the classes Hugging Face names in
    `_no_split_modules` (for a critic, its backbone's)."""
    names: set[str] = set()
    for module in model.modules():
        names |= set(getattr(module, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ShardError(
            f"{type(model).__name__}: no decoder layers to shard (the model names no "
            "_no_split_modules); trainer ranks need a Hugging Face transformer"
        )
    return layers


def shard_model(model: torch.nn.Module, mesh: Any = None) -> None:
    """FSDP2 over the default process group, in place: each decoder layer, then the root;
    gradients summed over ranks (see the module docstring)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # gloo has no pre-multiplied sum; a plain sum is what a divide factor of 1 means
            module.set_force_sum_reduction_for_comms(True)


def reshard(model: torch.nn.Module) -> None:
    """Put a sharded model's parameters back in their shards. FSDP2 keeps the root's gathered
    after a forward that no backward follows (a no-grad pass); the optimizer and the gradient
    clipping must see the sharded parameters. A model that is not sharded is left alone."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
