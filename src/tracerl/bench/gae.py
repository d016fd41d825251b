"""`tracerl bench gae`: `tracerl.algo.advantages.gae` against the straightforward dense column
scan (actions gathered into `[num_trajectories, max_actions]`, then a reverse Python loop over
columns), on 32k- and 128k-token packs with 4, 16 and 64 trajectories and half the tokens actions
(interleaved in runs, as agent turns are). The per-token loop reference gives the max abs error."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from tracerl.algo.advantages import gae

GAMMA, LAM = 1.0, 0.95
TARGET_32K = 10.0
TARGET_32K_4 = 50.0
TARGET_ERR = 1e-5


def make_pack(tokens: int, trajectories: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randperm(tokens - 1, generator=g)[: trajectories - 1] + 1).values
    cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([tokens])]).long()
    # Alternate observation and action runs of random lengths: about half the tokens are actions.
    runs = torch.randint(8, 64, (tokens // 8 + 2,), generator=g)
    kinds = torch.arange(runs.numel()) % 2
    mask = torch.repeat_interleave(kinds, runs)[:tokens].float()
    values = torch.randn(tokens, generator=g) * 0.5
    rewards = torch.zeros(tokens)
    last = mask.nonzero().squeeze(1)
    rewards[last[torch.randint(0, last.numel(), (trajectories,), generator=g)]] = 1.0
    return values, rewards, mask, cu


def column_scan(
    values: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    cu: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """The baseline: gather actions into [B, max_actions], reverse loop over columns."""
    b = cu.numel() - 1
    idx = mask.bool().nonzero().squeeze(1)
    traj = torch.searchsorted(cu, idx, right=True) - 1
    counts = torch.bincount(traj, minlength=b)
    starts = torch.cumsum(counts, 0) - counts
    col = torch.arange(idx.numel()) - starts[traj]
    width = int(counts.max())
    v = torch.zeros(b, width + 1)
    r = torch.zeros(b, width)
    valid = torch.zeros(b, width, dtype=torch.bool)
    v[traj, col] = values[idx]
    r[traj, col] = rewards[idx]
    valid[traj, col] = True
    adv = torch.zeros(b, width)
    running = torch.zeros(b)
    for t in range(width - 1, -1, -1):
        delta = r[:, t] + gamma * v[:, t + 1] - v[:, t]
        running = torch.where(valid[:, t], delta + gamma * lam * running, running)
        adv[:, t] = running
    out = torch.zeros_like(values)
    out[idx] = adv[traj, col]
    return out


def per_token(
    values: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    cu: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    out = [0.0] * values.numel()
    v, r, m = values.tolist(), rewards.tolist(), mask.tolist()
    for b in range(cu.numel() - 1):
        running, next_v = 0.0, 0.0
        for t in range(int(cu[b + 1]) - 1, int(cu[b]) - 1, -1):
            if m[t]:
                running = r[t] + gamma * next_v - v[t] + gamma * lam * running
                out[t] = running
                next_v = v[t]
    return torch.tensor(out, dtype=torch.float64)


def _best(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main(args: argparse.Namespace) -> int:
    cases = []
    for tokens in (32768, 131072):
        for trajectories in (4, 16, 64):
            values, rewards, mask, cu = make_pack(tokens, trajectories, seed=tokens + trajectories)
            pack = (values, rewards, mask, cu, GAMMA, LAM)
            ours = _best(lambda pack=pack: gae(*pack), 20)  # type: ignore[misc]
            col = _best(lambda pack=pack: column_scan(*pack), 3)  # type: ignore[misc]
            adv, _ = gae(values, rewards, mask, cu, GAMMA, LAM)
            ref = per_token(values, rewards, mask, cu, GAMMA, LAM)
            col_adv = column_scan(values, rewards, mask, cu, GAMMA, LAM)
            cases.append(
                {
                    "tokens": tokens,
                    "trajectories": trajectories,
                    "gae_ms": round(ours * 1e3, 3),
                    "column_scan_ms": round(col * 1e3, 3),
                    "speedup": round(col / ours, 1),
                    "max_abs_err": float((adv.double() - ref).abs().max()),
                    "column_scan_max_abs_err": float((col_adv.double() - ref).abs().max()),
                }
            )
    small = [c for c in cases if c["tokens"] == 32768]
    met = (
        all(c["speedup"] >= TARGET_32K for c in small)
        and all(c["speedup"] >= TARGET_32K_4 for c in small if c["trajectories"] == 4)
        and all(c["max_abs_err"] <= TARGET_ERR for c in cases)
    )
    print(
        json.dumps(
            {
                "benchmark": "gae",
                "gamma": GAMMA,
                "lam": LAM,
                "threads": torch.get_num_threads(),
                "cases": cases,
                "targets": {
                    "speedup_32k_min": TARGET_32K,
                    "speedup_32k_4_trajectories_min": TARGET_32K_4,
                    "max_abs_err_max": TARGET_ERR,
                },
                "target_met": met,
            }
        ),
        flush=True,
    )
    return 0
