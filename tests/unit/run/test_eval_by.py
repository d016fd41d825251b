"""`eval.by`: an eval's accuracy per value of a task field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracerl.config import TrainCommandConfig, load_config
from tracerl.envs.dataset import DatasetError, TaskDataset
from tracerl.run.evals import accuracy_by
from tracerl.run.rollouts import open_environment

TINY = Path(__file__).parents[3] / "examples" / "tiny.toml"


def test_accuracy_per_value_counts_every_sample_of_its_tasks() -> None:
    tasks = [{"high": 16}, {"high": 8}, {"high": 32}, {"high": 8}, {"high": 16}]
    # rollouts stand in as their success flags; 2 samples a task
    per_task = [[True, False], [True, True], [False, False], [False, True], [True, True]]
    got = accuracy_by("high", tasks, per_task, lambda r: bool(r))  # type: ignore[arg-type]
    assert got == {
        "eval/accuracy/high=8": 0.75,  # 3 of the 4 samples of the two range-8 tasks
        "eval/accuracy/high=16": 0.75,
        "eval/accuracy/high=32": 0.0,
    }
    assert list(got) == ["eval/accuracy/high=8", "eval/accuracy/high=16", "eval/accuracy/high=32"]
    assert accuracy_by(None, tasks, per_task, bool) == {}  # type: ignore[arg-type]


def test_a_task_without_the_field_is_refused_naming_the_setting_and_row() -> None:
    dataset = TaskDataset([{"depth": 1}, {"depth": None}], source="heldout.jsonl")
    with pytest.raises(DatasetError, match=r"heldout.jsonl:row 2: eval.by = 'depth' needs that"):
        dataset.check_field("depth", "eval.by")


def test_the_run_refuses_a_field_its_eval_tasks_lack_before_any_episode() -> None:
    def config(*overrides: str) -> TrainCommandConfig:
        common = ["eval.every=1", "eval_dataset.generate=concise", "eval_dataset.num_tasks=4"]
        return load_config(TrainCommandConfig, TINY, [*common, *overrides])

    closers: list[object] = []
    *_, held_out = open_environment(config("eval.by=max_words"), closers)
    assert held_out is not None and len(held_out) == 4
    with pytest.raises(DatasetError, match=r"eval.by = 'difficulty' needs that field"):
        open_environment(config("eval.by=difficulty"), closers)
    with pytest.raises(ValueError, match="eval.by is set but eval_dataset is not"):
        load_config(TrainCommandConfig, TINY, ["eval.by=max_words"])
