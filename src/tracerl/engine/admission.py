"""The KV memory policy shared by the embedded engine's scheduler and the simulated engine:
which waiting sequences to admit and which running ones to preempt.

Sequences are anything with `length` (prompt + output tokens), `kv_len` (tokens cached) and
`admit_order`. Torch-free, so the simulated engine stays light to start.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def preemption_victims(running: list[Any], kv_budget: int) -> list[Any]:
    """The running sequences to preempt, newest first, until the rest can each write one more
    token within `kv_budget` (one always stays). One pass, so thousands in flight stay cheap.
    """
    used = sum(s.kv_len for s in running)
    left = len(running)
    victims: list[Any] = []
    for seq in sorted(running, key=lambda s: s.admit_order, reverse=True):
        if left <= 1 or used + left <= kv_budget:
            break
        victims.append(seq)
        used -= seq.kv_len
        left -= 1
    return victims


def admissible(
    waiting: Iterable[Any],
    running: list[Any],
    kv_budget: int,
    max_running: int,
    prefill_cap: int | None = None,
) -> int:
    """How many sequences from the front of `waiting` to admit: each needs a free slot and KV
    room for its prefix plus this step's decode write of every running sequence; past the
    first, their prefixes together stay within `prefill_cap`."""
    kv_after = sum(s.kv_len for s in running) + len(running)
    count = prefill = 0
    for seq in waiting:
        need = seq.length + 1
        if len(running) + count >= max_running or kv_after + need > kv_budget:
            break
        if prefill_cap is not None and count and prefill + seq.length > prefill_cap:
            break
        kv_after += need
        prefill += seq.length
        count += 1
    return count
