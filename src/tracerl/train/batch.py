"""What the trainer takes (`TrainSample`) and how a step's samples become model inputs.

Per-token data of a step lives in one packed layout: the samples' tokens concatenated, `[N]`,
with `cu_seqlens` `[B + 1]` marking boundaries (the layout of `tracerl.algo`). Only a
micro-batch's model input differs by `batching`, always under `token_budget` tokens (padding
included; a longer sample gets a micro-batch of its own):

- `pack`: samples concatenated into one row `[1, n]` (first-fit decreasing), positions
  restarting at 0 for each, so nothing is padded. Right for attention kernels that take packed
  rows as variable-length sequences (flash-attention); SDPA instead builds a dense `[n, n]`
  block mask and pays for attention across samples it then discards.
- `bucket`: group by length: sorted longest first and cut into runs padded only to their own
  longest, trading padding against the number of micro-batches (`plan_buckets`). Little
  padding, and attention stays within each sample on any backend.
- `pad`: naive padding of every sample to the longest of the batch, `token_budget // L` rows
  per micro-batch: the benchmark baseline.

With `share_prefix` (bucket only), the samples of a group that begin with the same prompt
tokens are laid in one row as a tree: the shared prefix once, then each sample's rest, under a
4-D attention mask where each rest attends to the prefix and to itself (positions continue from
the prefix). A group of 8 completions of a 50-token prompt then costs the prompt once instead of
8 times; the outputs are those of the samples run one by one. The prefix stops before the
token whose output predicts the first action, so every kept output has a position of its own.

A mixture-of-experts sample may carry its recorded routing (`routed_experts`, a row per token,
`tracerl.routing`); the packed layout holds it as `[N, L, k]` (-1 where unrecorded) and every
micro-batch lays it out cell for cell like its `input_ids` (`MicroBatch.routing`), for the
trainer's routing replay (`tracerl.train.replay`).

Either way a micro-batch's model outputs are wanted only at positions whose *next* token is an
action (`keep`); they come back flattened in packed order, so `actions` (their positions in the
step's packed layout) is all it takes to put results in place.

This module does not run models.

One module of ~440 lines: the packed layout and its three micro-batch plans (pack, bucket,
shared-prompt tree rows) share the same index arithmetic over `cu_seqlens`, and are tested as one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from tracerl.config.train import DEFAULT_BUCKET_SPLIT_COST, TrainerConfig
from tracerl.routing import unrecorded
from tracerl.trace.schema import Trajectory

Batching = Literal["pack", "bucket", "pad"]


class SampleError(ValueError):
    """A training sample that cannot be trained on (the message names the sample and field)."""


@dataclass(frozen=True, slots=True)
class TrainSample:
    """One trajectory as the trainer takes it.

    `logprobs[t]` is the rollout log-probability of `token_ids[t]` (0.0 where `loss_mask` is 0);
    `reward` is the trajectory's score, placed on its last action token (PPO) or compared within
    its group (`group_id`, group baselines); `weight_version` is the policy version that sampled it.
    """

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    group_id: int = 0
    weight_version: int = 0
    routed_experts: np.ndarray | None = None
    """A mixture-of-experts model's routing of `token_ids`, `[len(token_ids), L, k]`
    (`tracerl.routing`), for routing replay; None: the trainer routes by itself."""

    @classmethod
    def from_trajectory(
        cls, trajectory: Trajectory, *, reward: float, group_id: int = 0, weight_version: int = 0
    ) -> TrainSample:
        """From the gateway's recorded `Trajectory`; pass its oldest turn's `weight_version`."""
        return cls(
            token_ids=list(trajectory.token_ids),
            loss_mask=list(trajectory.loss_mask),
            logprobs=list(trajectory.logprobs),
            reward=reward,
            group_id=group_id,
            weight_version=weight_version,
            routed_experts=trajectory.routed_experts.array()
            if trajectory.routed_experts is not None
            else None,
        )

    def check(self, index: int) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise SampleError(
                f"sample {index}: token_ids, loss_mask and logprobs have lengths "
                f"{n}, {len(self.loss_mask)}, {len(self.logprobs)}"
            )
        if n < 2:
            raise SampleError(f"sample {index}: token_ids needs at least 2 tokens, got {n}")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise SampleError(f"sample {index}: loss_mask must hold only 0 and 1")
        if self.loss_mask[0]:
            raise SampleError(
                f"sample {index}: loss_mask[0] is 1, but the first token has no context"
            )
        if not math.isfinite(self.reward):
            raise SampleError(f"sample {index}: reward is {self.reward}")
        routing = self.routed_experts
        if routing is not None and (routing.ndim != 3 or routing.shape[0] != n):
            raise SampleError(
                f"sample {index}: routed_experts has shape {tuple(routing.shape)}, expected "
                f"[{n}, layers, top_k] (a row per token)"
            )
        bad = [
            t
            for t, (m, lp) in enumerate(zip(self.loss_mask, self.logprobs, strict=True))
            if m and not math.isfinite(lp)
        ]
        if bad:
            raise SampleError(
                f"sample {index}: logprobs[{bad[0]}] is {self.logprobs[bad[0]]} at an action token"
            )


@dataclass(frozen=True)
class PackedBatch:
    """A step's samples in the packed layout, on the training device."""

    token_ids: torch.Tensor  # [N] int64
    loss_mask: torch.Tensor  # [N] float32, 1 on action tokens
    rollout_logprobs: torch.Tensor  # [N] float32
    cu_seqlens: torch.Tensor  # [B + 1] int64
    rewards: torch.Tensor  # [B] float32
    group_ids: torch.Tensor  # [B] int64
    lengths: list[int]
    weight_versions: list[int]
    routing: torch.Tensor | None = None  # [N, L, k] int32, -1 unrecorded; None: none has it

    @classmethod
    def build(
        cls, samples: Sequence[TrainSample], device: torch.device, routing: bool = True
    ) -> PackedBatch:
        """`routing`: keep the samples' routed experts (for replay); off, they are dropped."""
        if not samples:
            raise SampleError("samples: a step needs at least one sample")
        for i, s in enumerate(samples):
            s.check(i)
        lengths = [len(s.token_ids) for s in samples]
        cu = torch.zeros(len(samples) + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(torch.tensor(lengths), 0)

        def cat(field: str, dtype: torch.dtype) -> torch.Tensor:
            flat = [x for s in samples for x in getattr(s, field)]
            return torch.tensor(flat, dtype=dtype, device=device)

        return cls(
            token_ids=cat("token_ids", torch.int64),
            loss_mask=cat("loss_mask", torch.float32),
            rollout_logprobs=cat("logprobs", torch.float32),
            cu_seqlens=cu.to(device),
            rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32, device=device),
            group_ids=torch.tensor([s.group_id for s in samples], dtype=torch.int64, device=device),
            lengths=lengths,
            weight_versions=[s.weight_version for s in samples],
            routing=_packed_routing(samples, device) if routing else None,
        )

    @property
    def size(self) -> int:
        return len(self.lengths)

    def token_index(self, samples: Sequence[int]) -> torch.Tensor:
        """Positions in the packed layout of `samples`' tokens, in the given order. `[n]`"""
        starts = self.cu_seqlens[torch.tensor(list(samples), device=self.cu_seqlens.device)]
        lengths = torch.tensor([self.lengths[i] for i in samples], device=starts.device)
        offsets = torch.arange(int(lengths.sum()), device=starts.device)
        first = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
        return torch.repeat_interleave(starts, lengths) + offsets - first

    def select(self, samples: Sequence[int]) -> PackedBatch:
        """The sub-batch of `samples`, in the given order."""
        index = self.token_index(samples)
        rows = torch.tensor(list(samples), device=self.rewards.device)
        lengths = [self.lengths[i] for i in samples]
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        return PackedBatch(
            token_ids=self.token_ids[index],
            loss_mask=self.loss_mask[index],
            rollout_logprobs=self.rollout_logprobs[index],
            cu_seqlens=cu.to(self.cu_seqlens.device),
            rewards=self.rewards[rows],
            group_ids=self.group_ids[rows],
            lengths=lengths,
            weight_versions=[self.weight_versions[i] for i in samples],
            routing=None if self.routing is None else self.routing[index],
        )


def _packed_routing(samples: Sequence[TrainSample], device: torch.device) -> torch.Tensor | None:
    """The samples' routing in the packed layout, `[N, L, k]` (-1 where unrecorded, a sample
    without any included), or None when no sample has any."""
    given = [(i, s.routed_experts) for i, s in enumerate(samples) if s.routed_experts is not None]
    if not given:
        return None
    shape = given[0][1].shape[1:]
    for i, routing in given:
        if routing.shape[1:] != shape:
            raise SampleError(
                f"sample {i}: routed_experts has {routing.shape[1]} layers x top-{routing.shape[2]}"
                f", sample {given[0][0]} {shape[0]} x top-{shape[1]}: not one model's routing"
            )
    parts = []
    for s in samples:
        if s.routed_experts is None:
            parts.append(np.full((len(s.token_ids), *shape), -1, dtype=np.int32))
        else:
            part = s.routed_experts.astype(np.int32)
            part[unrecorded(s.routed_experts)] = -1
            parts.append(part)
    return torch.from_numpy(np.concatenate(parts)).to(device)


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward's worth of samples and its model input."""

    samples: list[int]  # indices into the step's batch, in output order
    input_ids: torch.Tensor  # [R, L]
    position_ids: torch.Tensor | None  # [1, n] for packed rows, [R, L] for tree rows
    attention_mask: torch.Tensor | None  # [R, L] for padded rows, [R, 1, L, L] bool for trees
    keep: torch.Tensor  # [R, L] bool: outputs wanted here (the next token is an action)
    actions: torch.Tensor  # [k] positions in the step's packed layout, in output order
    tokens: torch.Tensor  # [k] the action tokens, in output order
    cu_seqlens: torch.Tensor  # [len(samples) + 1] over `actions`: each sample's action run
    routing: torch.Tensor | None = None  # [R, L, layers, top_k] like input_ids; -1 unrecorded

    @property
    def num_tokens(self) -> int:
        """Tokens the model processes, padding included."""
        return self.input_ids.numel()


def resolve_batching(batching: str, actor: Any) -> Batching:
    """`auto`: packed rows with a flash-attention implementation, else grouped by length."""
    if batching != "auto":
        return batching  # type: ignore[return-value]
    attention = str(getattr(actor.config, "_attn_implementation", ""))
    return "pack" if "flash" in attention else "bucket"


def plan_packs(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group sample indices into rows of at most `token_budget` tokens (first-fit decreasing;
    a longer sample gets a row of its own). Each row lists its samples in ascending order."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(token_budget - lengths[i])
    return [sorted(row) for row in rows]


def plan_padded(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Naive padding: samples in order, `token_budget // longest` rows per micro-batch."""
    per = max(1, token_budget // max(lengths))
    return [list(range(i, min(i + per, len(lengths)))) for i in range(0, len(lengths), per)]


def plan_buckets(lengths: Sequence[int], token_budget: int, split_cost: float) -> list[list[int]]:
    """Group by length: samples sorted longest first, cut into runs that each pad to their own
    longest, under `token_budget` padded tokens (a longer sample runs alone). The cut minimises
    padded tokens plus `split_cost` per micro-batch, exactly (dynamic programming over the
    sorted order; a run's cost only grows as it reaches back to longer samples, so each
    position looks back at most `token_budget / length` samples)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    sorted_lengths = [lengths[i] for i in order]
    best = [0.0] + [math.inf] * len(order)  # best[j]: cost of grouping the first j samples
    start = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j - 1, -1, -1):
            rows = j - i
            if rows > 1 and rows * sorted_lengths[i] > token_budget:
                break
            cost = best[i] + rows * sorted_lengths[i] + split_cost
            if cost < best[j]:
                best[j], start[j] = cost, i
    groups: list[list[int]] = []
    j = len(order)
    while j > 0:
        groups.append(sorted(order[start[j] : j]))
        j = start[j]
    return groups[::-1]


def micro_batches(
    batch: PackedBatch,
    samples: Sequence[int],
    token_budget: int,
    batching: Batching,
    split_cost: float = DEFAULT_BUCKET_SPLIT_COST,
    share_prefix: bool = False,
) -> list[MicroBatch]:
    """Cut `samples` (indices into `batch`) into micro-batches under `token_budget`.
    `split_cost` (bucket): padded tokens one more micro-batch is worth, as a fraction of
    `token_budget` (`trainer.bucket_split_cost`). `share_prefix` (bucket): a group's shared
    prompt is forwarded once (tree rows)."""
    lengths = [batch.lengths[i] for i in samples]
    cost = token_budget * split_cost
    if batching == "bucket" and share_prefix:
        units = prefix_units(batch, samples, token_budget)
        if any(shared for _, shared in units):
            sizes = [_unit_length(batch, u) for u in units]
            out = []
            for part in plan_buckets(sizes, token_budget, cost):
                chosen_units = [units[j] for j in part]
                if any(shared for _, shared in chosen_units):
                    out.append(_build_trees(batch, chosen_units))
                else:  # nothing shared here: plain rows, without a [L, L] mask
                    chosen = [u[0][0] for u in chosen_units]
                    width = max(batch.lengths[i] for i in chosen)
                    out.append(_build(batch, chosen, "bucket", width))
            return out
    if batching == "pack":
        plan = plan_packs(lengths, token_budget)
    elif batching == "bucket":
        plan = plan_buckets(lengths, token_budget, cost)
    elif batching == "pad":
        plan = plan_padded(lengths, token_budget)
    else:
        raise ValueError(f"batching: expected pack, bucket or pad, got {batching!r}")
    out = []
    for part in plan:
        chosen = [samples[j] for j in part]
        # pad: every row as long as the longest of all `samples`; bucket: of its micro-batch
        width = max(lengths) if batching == "pad" else max(batch.lengths[i] for i in chosen)
        out.append(_build(batch, chosen, batching, width))
    return out


def micro_batches_for(
    batch: PackedBatch,
    samples: Sequence[int],
    config: TrainerConfig,
    batching: Batching,
    share_prefix: bool | None = None,
) -> list[MicroBatch]:
    """`micro_batches` as the trainer's config lays them out (`share_prefix`: overrides the
    config's, for a model whose attention a tree mask would change)."""
    return micro_batches(
        batch, samples, config.token_budget, batching, config.bucket_split_cost,
        config.share_prefix if share_prefix is None else share_prefix,
    )  # fmt: skip


def _build(batch: PackedBatch, samples: list[int], batching: Batching, width: int) -> MicroBatch:
    device = batch.token_ids.device
    index = batch.token_index(samples)  # [n]
    ids, mask = batch.token_ids[index], batch.loss_mask[index]
    lengths = [batch.lengths[i] for i in samples]
    next_is_action = torch.zeros_like(mask, dtype=torch.bool)
    next_is_action[:-1] = mask[1:].bool()  # never crosses samples: a first token is no action
    segment = torch.repeat_interleave(
        torch.arange(len(samples), device=device), torch.tensor(lengths, device=device)
    )
    action_counts = torch.zeros(len(samples), device=device).index_add(0, segment, mask)
    cu = torch.zeros(len(samples) + 1, dtype=torch.int64, device=device)
    cu[1:] = torch.cumsum(action_counts.long(), 0)
    actions = index[mask.bool()]
    common = {"actions": actions, "tokens": batch.token_ids[actions], "cu_seqlens": cu}
    if batching == "pack":
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])
        return MicroBatch(
            samples=samples,
            input_ids=ids[None],
            position_ids=positions[None],
            attention_mask=None,
            keep=next_is_action[None],
            routing=_routing_at(batch, index[None]),
            **common,
        )
    rows = len(samples)
    column = torch.arange(width, device=device)[None, :]  # [1, L]
    present = column < torch.tensor(lengths, device=device)[:, None]  # [R, L]
    input_ids = torch.zeros(rows, width, dtype=torch.int64, device=device)
    keep = torch.zeros(rows, width, dtype=torch.bool, device=device)
    input_ids[present] = ids
    keep[present] = next_is_action
    source = torch.full((rows, width), -1, dtype=torch.int64, device=device)
    source[present] = index
    return MicroBatch(
        samples=samples,
        input_ids=input_ids,
        position_ids=None,
        attention_mask=present.long(),
        keep=keep,
        routing=_routing_at(batch, source),
        **common,
    )


def _routing_at(batch: PackedBatch, source: torch.Tensor) -> torch.Tensor | None:
    """The routing of the packed positions `source` (`[R, L]`, -1 for padding): `[R, L,
    layers, top_k]`, -1 where unrecorded or padding; None when the batch has none."""
    if batch.routing is None:
        return None
    out = batch.routing[source.clamp(min=0)]
    out[source < 0] = -1
    return out


Unit = tuple[list[int], int]  # (samples in one tree row, tokens they share at the start)


def _first_action(batch: PackedBatch, i: int) -> int:
    start = int(batch.cu_seqlens[i])
    mask = batch.loss_mask[start : start + batch.lengths[i]]
    hits = mask.nonzero()
    return int(hits[0]) if hits.numel() else batch.lengths[i]


def _unit_length(batch: PackedBatch, unit: Unit) -> int:
    members, shared = unit
    return shared + sum(batch.lengths[i] - shared for i in members)


def prefix_units(batch: PackedBatch, samples: Sequence[int], token_budget: int) -> list[Unit]:
    """`samples` as tree rows: the members of a group (in the given order) with the number of
    leading tokens they all share, stopped one token before the earliest first action (so no
    output that is kept falls in the prefix); a sample sharing nothing is a unit of its own. A
    unit longer than `token_budget` is cut into consecutive runs of members that fit (each
    repeats the prefix)."""
    by_group: dict[int, list[int]] = {}
    for i in samples:
        by_group.setdefault(int(batch.group_ids[i]), []).append(i)
    units: list[Unit] = []
    for members in by_group.values():
        shared = _shared_length(batch, members) if len(members) > 1 else 0
        if shared == 0:
            units += [([i], 0) for i in members]
            continue
        run: list[int] = []
        for i in members:
            if run and _unit_length(batch, ([*run, i], shared)) > token_budget:
                units.append((run, shared) if len(run) > 1 else (run, 0))
                run = []
            run.append(i)
        units.append((run, shared) if len(run) > 1 else (run, 0))
    return units


def _shared_length(batch: PackedBatch, members: list[int]) -> int:
    limit = min(_first_action(batch, i) for i in members) - 1
    starts = [int(batch.cu_seqlens[i]) for i in members]
    rows = torch.stack([batch.token_ids[a : a + limit] for a in starts])  # [m, limit]
    differs = (rows != rows[:1]).any(0).nonzero()
    return int(differs[0]) if differs.numel() else max(limit, 0)


def _build_trees(batch: PackedBatch, units: list[Unit]) -> MicroBatch:
    """Tree rows: per unit, its shared prefix (segment 0) then each member's rest (segments
    1..m); padding is segment -1 and attends to itself only."""
    device = batch.token_ids.device
    width = max(_unit_length(batch, u) for u in units)
    rows = len(units)
    input_ids = torch.zeros(rows, width, dtype=torch.int64, device=device)
    positions = torch.zeros(rows, width, dtype=torch.int64, device=device)
    segments = torch.full((rows, width), -1, dtype=torch.int64, device=device)
    keep = torch.zeros(rows, width, dtype=torch.bool, device=device)
    source = torch.full((rows, width), -1, dtype=torch.int64, device=device)
    order: list[int] = []
    actions, counts = [], []
    for r, (members, shared) in enumerate(units):
        first = batch.token_index([members[0]])
        input_ids[r, :shared] = batch.token_ids[first[:shared]]
        source[r, :shared] = first[:shared]  # the prompt's routing as its first member saw it
        positions[r, :shared] = torch.arange(shared, device=device)
        segments[r, :shared] = 0
        column = shared
        for j, i in enumerate(members, start=1):
            index = batch.token_index([i])
            mask = batch.loss_mask[index].bool()
            rest = batch.lengths[i] - shared
            span = slice(column, column + rest)
            input_ids[r, span] = batch.token_ids[index[shared:]]
            source[r, span] = index[shared:]
            positions[r, span] = torch.arange(shared, batch.lengths[i], device=device)
            segments[r, span] = j
            keep[r, column : column + rest - 1] = mask[shared + 1 :]
            column += rest
            order.append(i)
            actions.append(index[mask])
            counts.append(int(mask.sum()))
    q, k = segments[:, :, None], segments[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    allowed = causal[None] & (k >= 0) & ((q == k) | (k == 0))
    allowed |= torch.eye(width, dtype=torch.bool, device=device)[None]
    cu = torch.zeros(len(order) + 1, dtype=torch.int64, device=device)
    cu[1:] = torch.cumsum(torch.tensor(counts, device=device), 0)
    flat = torch.cat(actions)
    return MicroBatch(
        samples=order,
        input_ids=input_ids,
        position_ids=positions,
        attention_mask=allowed[:, None],
        keep=keep,
        actions=flat,
        tokens=batch.token_ids[flat],
        cu_seqlens=cu,
        routing=_routing_at(batch, source),
    )
