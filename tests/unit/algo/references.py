"""Slow, obviously correct references: plain Python loops over float64 numbers."""

from __future__ import annotations

import itertools
import math

import torch


def segments(cu: torch.Tensor) -> list[tuple[int, int]]:
    c = cu.tolist()
    return list(itertools.pairwise(c))


def gae_ref(values, rewards, mask, cu, gamma, lam):
    v, r, m = values.double().tolist(), rewards.double().tolist(), mask.tolist()
    adv, ret = [0.0] * len(v), [0.0] * len(v)
    for start, end in segments(cu):
        running, next_value = 0.0, 0.0
        for t in range(end - 1, start - 1, -1):
            if not m[t]:
                continue  # observation tokens neither get an advantage nor discount the chain
            delta = r[t] + gamma * next_value - v[t]
            running = delta + gamma * lam * running
            adv[t], ret[t] = running, running + v[t]
            next_value = v[t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def terminal_ref(scores, mask, cu):
    out = [0.0] * mask.numel()
    for b, (start, end) in enumerate(segments(cu)):
        acts = [t for t in range(start, end) if mask[t]]
        if acts:
            out[acts[-1]] = float(scores[b])
    return torch.tensor(out, dtype=torch.float64)


def group_ref(rewards, groups, method, std_normalize=True, eps=1e-6):
    r, g = rewards.double().tolist(), groups.tolist()
    out = []
    for i, x in enumerate(r):
        members = [r[j] for j in range(len(r)) if g[j] == g[i]]
        mean = sum(members) / len(members)
        if max(members) == min(members):
            out.append(0.0)
        elif method == "grpo":
            std = math.sqrt(sum((y - mean) ** 2 for y in members) / len(members))
            out.append((x - mean) / (std + eps) if std_normalize else x - mean)
        elif method == "dr_grpo":
            out.append(x - mean)
        else:
            others = (sum(members) - x) / (len(members) - 1)
            out.append(x - others)
    return torch.tensor(out, dtype=torch.float64)


def aggregate_ref(per_token, mask, agg, cu):
    x, m = per_token.double().tolist(), mask.tolist()
    if agg == "token_mean":
        n = sum(m)
        return sum(a for a, k in zip(x, m, strict=True) if k) / max(n, 1)
    seqs = []
    for start, end in segments(cu):
        vals = [x[t] for t in range(start, end) if m[t]]
        s = sum(vals)
        seqs.append(s / max(len(vals), 1) if agg == "seq_mean_token_mean" else s)
    return sum(seqs) / len(seqs)


def policy_ref(lp, old, adv, clip_low, clip_high, dual_clip, rollout, tis_cap):
    out = []
    for i in range(lp.numel()):
        ratio = math.exp(float(lp[i]) - float(old[i]))
        a = float(adv[i])
        loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
        if dual_clip is not None and a < 0:
            loss = min(loss, -a * dual_clip)
        if rollout is not None:
            w = math.exp(float(old[i]) - float(rollout[i]))
            loss *= min(w, tis_cap) if tis_cap is not None else w
        out.append(loss)
    return torch.tensor(out, dtype=torch.float64)


def value_ref(values, old, returns, clip):
    out = []
    for v, o, r in zip(
        values.double().tolist(), old.double().tolist(), returns.double().tolist(), strict=True
    ):
        plain = (v - r) ** 2
        if clip is None:
            out.append(0.5 * plain)
        else:
            clipped = (o + min(max(v - o, -clip), clip) - r) ** 2
            out.append(0.5 * max(plain, clipped))
    return torch.tensor(out, dtype=torch.float64)


def random_pack(gen: torch.Generator, max_trajectories: int = 6, max_len: int = 80):
    """Packed trajectories with interleaved observation runs, one-token and action-free ones."""
    b = int(torch.randint(1, max_trajectories + 1, (1,), generator=gen))
    lengths = torch.randint(1, max_len, (b,), generator=gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    t = int(cu[-1])
    mask = (torch.rand(t, generator=gen) < 0.6).long()
    if b > 1:  # one trajectory without any action token
        start, end = int(cu[0]), int(cu[1])
        mask[start:end] = 0
    return cu, mask
