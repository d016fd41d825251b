"""Sharding invariance across two real processes (gloo on 127.0.0.1): a loss with one global
denominator, whitening and explained variance give the single-process numbers however the batch
is split over ranks and micro-batches."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tracerl.algo.advantages import whiten
from tracerl.algo.distributed import global_token_count
from tracerl.algo.losses import policy_loss
from tracerl.algo.stats import explained_variance

N = 40
# Uneven shards, each cut into a different number of micro-batches.
SHARDS = {0: [slice(0, 5), slice(5, 13)], 1: [slice(13, 20), slice(20, 31), slice(31, 40)]}


def batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(99)
    lp = torch.randn(N, generator=gen) - 1
    return {
        "lp": lp,
        "old": lp + 0.2 * torch.randn(N, generator=gen),
        "adv": torch.randn(N, generator=gen),
        "mask": (torch.rand(N, generator=gen) < 0.6).long(),
        "values": torch.randn(N, generator=gen),
        "returns": torch.randn(N, generator=gen),
    }


def worker(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        b = batch()
        lp = b["lp"].clone().requires_grad_(True)
        pieces = SHARDS[rank]
        mine = torch.cat([b["mask"][p] for p in pieces])
        denominator = global_token_count(mine)  # all-reduced over both ranks
        total = torch.zeros(())
        for p in pieces:  # gradient accumulation over this rank's micro-batches
            loss, _ = policy_loss(
                lp[p], b["old"][p], b["adv"][p], b["mask"][p], denominator=denominator
            )
            total = total + loss
        total.backward()
        assert lp.grad is not None
        dist.all_reduce(lp.grad)  # each rank holds its shard's part of the step gradient
        step_loss = total.detach().clone()
        dist.all_reduce(step_loss)
        rows = torch.cat([torch.arange(N)[p] for p in pieces])
        whitened = whiten(b["adv"][rows], b["mask"][rows])
        ev = explained_variance(b["values"][rows], b["returns"][rows], b["mask"][rows])
        torch.save(
            {"loss": step_loss, "grad": lp.grad, "rows": rows, "whitened": whitened, "ev": ev},
            Path(out) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_ranks_match_one_process(tmp_path) -> None:
    context = mp.spawn(worker, args=(free_port(), str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 120
    while not context.join(timeout=5):
        assert time.monotonic() < deadline, "gloo workers did not finish"
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    b = batch()
    lp = b["lp"].clone().requires_grad_(True)
    full, _ = policy_loss(lp, b["old"], b["adv"], b["mask"])
    full.backward()
    torch.testing.assert_close(r0["loss"], full.detach())
    torch.testing.assert_close(r0["grad"], lp.grad)
    torch.testing.assert_close(r1["grad"], lp.grad)
    whole = whiten(b["adv"], b["mask"])
    for r in (r0, r1):
        torch.testing.assert_close(r["whitened"], whole[r["rows"]])
        assert abs(r["ev"] - explained_variance(b["values"], b["returns"], b["mask"])) < 1e-12
