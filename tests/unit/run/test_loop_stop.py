"""A stop that lands while a step waits for rollouts ends the step cleanly."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tracerl.config import TrainCommandConfig, load_config
from tracerl.run.loop import RLLoop
from tracerl.run.rollouts import GroupBuffer


def test_a_step_stopped_while_waiting_returns_no_record_and_takes_nothing(tmp_path: Path) -> None:
    loop = RLLoop(load_config(TrainCommandConfig, None, []), tmp_path)
    loop.buffer = GroupBuffer(loop.config.orchestrator.group_size, filter_uniform=True)
    loop.buffer.open(0)  # outstanding, never ready

    async def stopped_step() -> object:
        loop._stop.set()
        task = asyncio.create_task(loop._step())
        await asyncio.wait({task}, timeout=30)
        assert task.done() and not task.cancelled()  # the run loop reads its result
        return task.result()

    assert asyncio.run(stopped_step()) is None
    assert loop.step == 0 and list(loop.buffer.pending) == [0]
