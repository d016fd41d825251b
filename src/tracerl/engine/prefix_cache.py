"""The prefix cache's index: finished sequences kept by their token ids, so that a request whose
prompt extends one (the next turn of an agent's episode, another sample of the same prompt)
computes only the tokens after it, as vLLM's and SGLang's prefix caches do.

Torch-free and payload-agnostic: the embedded engine keeps each entry's K/V with it
(`tracerl.engine.scheduler`), the simulated engine nothing (it only times the saving). The
policy is the one both share:
- `put` keeps a finished sequence's cached tokens, dropping entries it extends;
- `take` finds the entry that holds the most of a prompt, never the prompt's last token, whose
  logits the engine must compute. By default only an entry the prompt extends counts, and it
  leaves the cache (its memory now belongs to the running sequence: the simulated engine's
  model of vLLM's blocks). With `share`, any common prefix counts and the entry stays, as the
  newest: the embedded engine copies K/V out of it, so turns re-rendered differently still
  reuse their shared system prompt, and sibling samples of one prompt share its prefill;
- `evict` drops the least recently cached entries until the cache fits in the KV memory the
  running sequences leave free, so the cache never takes room a request needs;
- `clear` empties it: K/V computed by other weights must not serve a request after an update.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

KEY_TOKENS = 16
"""Leading tokens that key a lookup (candidates are then compared in full); a sequence shorter
than this is not cached."""

P = TypeVar("P")


@dataclass
class _Entry(Generic[P]):
    ids: list[int]
    payload: P


class PrefixCache(Generic[P]):
    def __init__(self) -> None:
        self._entries: OrderedDict[int, _Entry[P]] = OrderedDict()  # oldest first
        self._by_key: dict[tuple[int, ...], set[int]] = {}
        self._next_id = 0
        self.tokens = 0
        """Tokens held by all entries."""

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ids: list[int], payload: P) -> None:
        """Keep `ids` (the tokens whose K/V `payload` holds) as the newest entry."""
        if len(ids) < KEY_TOKENS:
            return
        key = tuple(ids[:KEY_TOKENS])
        for old in [e for e in self._by_key.get(key, ()) if _extends(ids, self._entries[e].ids)]:
            self._drop(key, old)  # may drop the key's set: it is looked up afresh below
        self._next_id += 1
        self._entries[self._next_id] = _Entry(list(ids), payload)
        self._by_key.setdefault(key, set()).add(self._next_id)
        self.tokens += len(ids)

    def take(self, prompt: list[int], share: bool = False) -> tuple[int, P | None]:
        """How many leading tokens of `prompt` a cached entry holds (at most all but the last),
        and that entry's payload; `(0, None)` on a miss. See the module docstring for `share`."""
        key = tuple(prompt[:KEY_TOKENS])
        candidates = self._by_key.get(key, ())
        if share:
            held = {e: _common(prompt, self._entries[e].ids) for e in candidates}
        else:
            held = {e: len(self._entries[e].ids) for e in candidates}
            held = {e: n for e, n in held.items() if _extends(prompt, self._entries[e].ids)}
        if not held:
            return 0, None
        best = max(held, key=held.__getitem__)
        entry = self._entries[best]
        if share:
            self._entries.move_to_end(best)
        else:
            self._drop(key, best)
        return min(held[best], len(prompt) - 1), entry.payload

    def evict(self, room: int) -> None:
        """Drop the least recently cached entries until the cache holds at most `room` tokens."""
        while self._entries and self.tokens > max(0, room):
            entry_id, entry = next(iter(self._entries.items()))
            self._drop(tuple(entry.ids[:KEY_TOKENS]), entry_id)

    def clear(self) -> None:
        self._entries.clear()
        self._by_key.clear()
        self.tokens = 0

    def _drop(self, key: tuple[int, ...], entry_id: int) -> None:
        self.tokens -= len(self._entries.pop(entry_id).ids)
        self._by_key[key].discard(entry_id)
        if not self._by_key[key]:
            del self._by_key[key]


def _extends(ids: list[int], prefix: list[int]) -> bool:
    return len(ids) >= len(prefix) and ids[: len(prefix)] == prefix


def _common(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix (slice comparisons run in C: a bisection over them)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
