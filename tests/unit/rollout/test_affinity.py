"""Session affinity: a session stays on its engine, and the map of sessions stays bounded."""

from __future__ import annotations

import pytest

from tracerl.rollout import pool as pool_module
from tracerl.rollout.pool import EnginePool, Member


async def test_sessions_stick_to_their_engine_and_the_oldest_are_forgotten(monkeypatch) -> None:
    monkeypatch.setattr(pool_module, "AFFINITY_SESSIONS", 8)
    pool = EnginePool([Member("a", engine=None), Member("b", engine=None)])  # type: ignore[arg-type]
    first = await pool._pick("s0", set())
    for i in range(1, 20):
        member = await pool._pick(f"s{i}", set())
        member.inflight += 1  # busier engines are picked less: sessions spread over both
        if i % 3 == 0:  # s0 is used again now and then: it stays remembered
            assert await pool._pick("s0", set()) is first
    assert len(pool._affinity) == 8
    assert "s0" in pool._affinity and "s1" not in pool._affinity
    assert {m.name for m in pool._affinity.values()} == {"a", "b"}


@pytest.mark.parametrize("sessions", [1, 100])
async def test_a_remembered_session_is_routed_to_the_same_engine(sessions: int) -> None:
    pool = EnginePool([Member("a", engine=None), Member("b", engine=None)])  # type: ignore[arg-type]
    chosen = {f"s{i}": await pool._pick(f"s{i}", set()) for i in range(sessions)}
    for key, member in chosen.items():
        assert await pool._pick(key, set()) is member
