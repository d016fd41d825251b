"""A sampled eval's seeds: one per task and sample, the same at every eval."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tracerl.config import TrainCommandConfig, load_config
from tracerl.control.dispatcher import Episode
from tracerl.envs.dataset import TaskDataset
from tracerl.run.evals import Evals

TINY = Path(__file__).parents[3] / "examples" / "tiny.toml"


class Submitted:
    """A dispatcher that keeps what it is given and runs nothing."""

    def __init__(self) -> None:
        self.episodes: list[Episode] = []

    async def submit(self, episode: Episode) -> None:
        self.episodes.append(episode)


async def eval_seeds(evals: Evals, dispatcher: Submitted, step: int) -> dict[str, int]:
    dispatcher.episodes.clear()
    task = evals.start(step)
    while len(dispatcher.episodes) < 6:  # 3 tasks x 2 samples, then it waits for their ends
        await asyncio.sleep(0)
    task.cancel()
    return {e.episode_id.split("-", 1)[1]: e.payload.sampling["seed"] for e in dispatcher.episodes}


async def test_every_task_and_sample_draws_with_its_own_seed_at_every_eval() -> None:
    overrides = ["eval.samples=2", "eval.sampling.temperature=1.0", "loop.seed=3"]
    config = load_config(TrainCommandConfig, TINY, overrides)
    dataset = TaskDataset([{"prompt": f"q{i}"} for i in range(3)], source="t", shuffle=False)
    dispatcher = Submitted()
    evals = Evals(config, "arithmetic", dataset, dispatcher, None, None)  # type: ignore[arg-type]
    first = await eval_seeds(evals, dispatcher, 0)
    assert sorted(first) == ["0-0", "0-1", "1-0", "1-1", "2-0", "2-1"]  # task-sample
    # all the same before: every task drew its samples from seeds 3 and 4
    assert len(set(first.values())) == 6
    assert await eval_seeds(evals, dispatcher, 5) == first  # a later eval: the same draws
    other = load_config(TrainCommandConfig, TINY, [*overrides[:2], "loop.seed=4"])
    evals = Evals(other, "arithmetic", dataset, dispatcher, None, None)  # type: ignore[arg-type]
    assert set((await eval_seeds(evals, dispatcher, 0)).values()).isdisjoint(first.values())
