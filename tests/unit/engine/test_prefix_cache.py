"""The prefix cache's index, shared by the embedded and the simulated engine."""

from __future__ import annotations

from tracerl.engine.prefix_cache import KEY_TOKENS, PrefixCache


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_an_extending_prompt_takes_the_longest_entry_and_the_entry_leaves() -> None:
    cache: PrefixCache[str] = PrefixCache()
    cache.put(ids(20), "short")
    cache.put(ids(20, 500), "elsewhere")
    cache.put(ids(30), "long")  # extends "short", which it replaces
    assert len(cache) == 2 and cache.tokens == 50
    assert cache.take(ids(40)) == (30, "long")
    assert cache.take(ids(40)) == (0, None)  # taken: its memory went to the request
    assert cache.take(ids(18, 500) + ids(9)) == (0, None)  # "elsewhere" is not a prefix of it
    assert cache.take(ids(20, 500)) == (19, "elsewhere")  # the last prompt token is computed


def test_shared_lookups_match_any_common_prefix_and_keep_the_entry() -> None:
    cache: PrefixCache[str] = PrefixCache()
    cache.put(ids(30), "a")
    cache.put(ids(25, 900), "b")
    prompt = ids(22) + ids(10, 7000)  # diverges from "a" after 22 tokens
    assert cache.take(prompt, share=True) == (22, "a")
    assert cache.take(prompt, share=True) == (22, "a")  # still there
    cache.evict(30)  # the oldest goes first: "b", since the lookup made "a" the newest
    assert cache.take(ids(25, 900), share=True) == (0, None)
    assert cache.take(ids(31), share=True) == (30, "a")


def test_short_sequences_are_not_kept_and_clear_forgets_everything() -> None:
    cache: PrefixCache[None] = PrefixCache()
    cache.put(ids(KEY_TOKENS - 1), None)
    assert len(cache) == 0
    cache.put(ids(KEY_TOKENS), None)
    cache.put(ids(40, 100), None)
    cache.evict(100)
    assert len(cache) == 2
    cache.evict(-5)  # no room at all
    assert len(cache) == 0 and cache.tokens == 0
    cache.put(ids(40), None)
    cache.clear()
    assert cache.take(ids(50), share=True) == (0, None) and cache.tokens == 0
