"""The soak: 500 three-turn sessions through the gateway and the pool over three launched
simulated engines that crash, hang, return malformed replies and 5xx, and sample OOV ids.
Nothing may be lost or duplicated, and no success may lack its recorded turn."""

from __future__ import annotations

from tracerl.bench.faults import run_soak


async def test_soak_loses_nothing() -> None:
    result = await run_soak(sessions=500, turns=3, timeout_s=240)
    assert result.lost == 0
    assert result.completed + result.failed == 500
    assert result.duplicated_or_missing == 0
    assert result.success_without_record == 0
    assert result.turns_recorded == result.turns_ok > 0
    # the faults really happened and were handled
    assert result.pool.get("retries", 0) + result.pool.get("resumes", 0) > 0
    assert result.pool.get("deactivated", 0) >= 2
