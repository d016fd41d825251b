"""Evals of the loop's weights: every eval task `eval.samples` times, on one weight version.

`Evals.start(step)` submits the eval episodes (kind "eval", the eval's own sampling, greedy by
default) to the loop's dispatcher, which never sheds them; until every one has ended, `idle` is
clear, and the loop then admits no training episode and pushes no newer weights, so the eval
measures exactly the weights of `step`. The loop hands each ended eval episode to `record`. The
result (reward, accuracy, pass@k, the weight versions seen) goes to the metrics log and the
progress line. Owns no engine, no trainer and no training data.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Callable
from typing import Any

from tracerl.config.run import TrainCommandConfig
from tracerl.control.dispatcher import Dispatcher, DispatcherClosed, Episode
from tracerl.envs.base import Task
from tracerl.envs.dataset import TaskDataset
from tracerl.run.metrics import MetricsLog, Progress, process_elapsed_s
from tracerl.run.rollouts import Play, Rollout, episode_seed

log = logging.getLogger(__name__)


class Evals:
    def __init__(
        self,
        config: TrainCommandConfig,
        env_name: str,
        dataset: TaskDataset | None,
        dispatcher: Dispatcher,
        metrics: MetricsLog,
        progress: Progress,
    ) -> None:
        self.config = config
        self.env_name = env_name
        self.dataset = dataset
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.progress = progress
        self.idle = asyncio.Event()  # no eval in flight: train admissions and pushes go on
        self.idle.set()
        self.last_step: int | None = None
        self._running = 0
        self._results: dict[int, list[Rollout]] = {}
        self._changed = asyncio.Event()  # an eval episode ended

    def start(self, step: int) -> asyncio.Task[None]:
        """An eval of the weights of `step`; `idle` stays clear until it ends."""
        self.last_step = step
        self._running += 1
        self.idle.clear()
        task = asyncio.create_task(self._evaluate(step))
        task.add_done_callback(self._ended)
        return task

    def record(self, group: int, rollout: Rollout) -> None:
        """An eval episode ended (a cancelled one as a failed rollout: the eval still ends)."""
        self._results.setdefault(group, []).append(rollout)
        self._changed.set()

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._running -= 1
        if not self._running:
            self.idle.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("eval failed: %r", task.exception())

    async def _evaluate(self, step: int) -> None:
        """Every eval task `eval.samples` times with the eval's own sampling (greedy by
        default), at the weights of `step`; logs reward, accuracy and pass@k."""
        assert self.dataset is not None
        c, e = self.config, self.config.eval
        sampling = {k: v for k, v in e.sampling.model_dump().items() if v is not None}
        seed = c.loop.seed
        groups = []
        for index in range(len(self.dataset)):
            group = -(step * 1_000_000 + index + 1)  # negative: never a training group
            groups.append(group)
            for k in range(e.samples):
                episode = Episode(
                    f"eval{step}-{index}-{k}",
                    group,
                    env=self.env_name,
                    kind="eval",
                    payload=Play(
                        self.dataset[index], {**sampling, "seed": episode_seed(seed, index, k)}
                    ),
                )
                try:
                    await self.dispatcher.submit(episode)
                except DispatcherClosed:
                    return
        while sum(len(self._results.get(g, [])) for g in groups) < len(groups) * e.samples:
            self._changed.clear()
            await self._changed.wait()
        per_task = [self._results.pop(g, []) for g in groups]
        rollouts = [r for task in per_task for r in task]
        good = [r.result.reward for r in rollouts if r.ok and r.result.reward is not None]

        def success(r: Rollout) -> bool:
            return r.ok and r.result.reward is not None and r.result.reward >= e.success_reward

        record: dict[str, Any] = {
            "step": step,
            "eval/reward_mean": statistics.fmean(good) if good else float("nan"),
            "eval/accuracy": statistics.fmean(success(r) for r in rollouts),
            f"eval/pass@{e.samples}": statistics.fmean(any(map(success, t)) for t in per_task),
            "eval/episodes": len(rollouts),
            "eval/failed": len(rollouts) - len(good),
            "eval/weight_version_min": min((r.version for r in rollouts if r.ok), default=-1),
            "eval/weight_version_max": max((r.version for r in rollouts if r.ok), default=-1),
            "time/elapsed_s": process_elapsed_s(),
        }
        by = accuracy_by(e.by, self.dataset.tasks, per_task, success)  # per_task: in task order
        record.update(by)
        self.metrics.log(record)
        self.progress.eval_accuracy = record["eval/accuracy"]
        print(
            f"eval at step {step}: accuracy {record['eval/accuracy']:.3f}, "
            f"pass@{e.samples} {record[f'eval/pass@{e.samples}']:.3f}, reward "
            f"{record['eval/reward_mean']:.3f} over {len(good)} episodes "
            f"({record['eval/failed']} failed)"
            + "".join(f"; {k.removeprefix('eval/accuracy/')}: {v:.3f}" for k, v in by.items()),
            flush=True,
        )


def accuracy_by(
    field: str | None,
    tasks: list[Task],
    per_task: list[list[Rollout]],
    success: Callable[[Rollout], bool],
) -> dict[str, float]:
    """`eval/accuracy/FIELD=VALUE`: the mean success over the samples of the tasks whose
    `field` is VALUE, values in sorted order (none without `eval.by`)."""
    if field is None:
        return {}
    samples: dict[Any, list[bool]] = {}
    for task, rollouts in zip(tasks, per_task, strict=True):
        samples.setdefault(task[field], []).extend(map(success, rollouts))
    return {
        f"eval/accuracy/{field}={value}": statistics.fmean(samples[value])
        for value in sorted(samples, key=lambda v: (type(v).__name__, v))  # 8 before 16
    }
