"""Datasets: JSONL and Parquet rows, errors that name the file and line, seeded shuffles, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.config.envs import DatasetConfig
from tracerl.envs.dataset import DatasetError, TaskDataset, load_dataset, read_tasks


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_rows_in_file_order(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{k}", "answer": k} for k in range(5)]
    path = write_jsonl(tmp_path / "train.jsonl", [json.dumps(r) for r in rows[:2]] + ["", "  "])
    with path.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[2:])
    ds = load_dataset(DatasetConfig(path=str(path), shuffle=False), ["prompt", "answer"])
    assert [ds.next().task for _ in range(5)] == rows  # blank lines skipped
    assert ds.next().index == 0 and ds.position == 6  # the next epoch starts over


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"prompt": "a", "answer": 1}', '{"answer": 2}'], ':2: missing field "prompt"'),
        (['{"prompt": "a", "answer": 1}', "", '{"prompt": "b"'], ":3: invalid JSON"),
        (['["prompt", "answer"]'], ":1: expected a JSON object, got list"),
        (['{"prompt": null, "answer": 1}'], ':1: field "prompt" is null'),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    with pytest.raises(DatasetError) as err:
        load_dataset(DatasetConfig(path=str(path)), ["prompt", "answer"])
    assert str(err.value).startswith(f"{path}{message}")


def test_a_huge_row_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    rows = ['{"prompt": "a", "answer": 1}', json.dumps({"prompt": "x" * 5000, "answer": 2})]
    path = write_jsonl(tmp_path / "train.jsonl", [*rows, '{"prompt": "c", "answer": 3}'])
    config = DatasetConfig(path=str(path), max_row_bytes=4096)
    with pytest.raises(DatasetError) as err:
        load_dataset(config, ["prompt", "answer"])
    assert str(err.value) == f"{path}:2: row longer than 4096 bytes (dataset.max_row_bytes)"
    # a line exactly at the limit (newline included) is a row like any other
    exact = json.dumps({"prompt": "y" * 10, "answer": 1})
    path.write_text(exact + "\n")
    limit = DatasetConfig(path=str(path), max_row_bytes=len(exact) + 1)
    assert load_dataset(limit, ["prompt"]).next().task["prompt"] == "y" * 10


def test_bad_files(tmp_path: Path) -> None:
    (tmp_path / "bytes.jsonl").write_bytes(b'{"prompt": "a"}\n\xff\xfe\n')
    with pytest.raises(DatasetError, match=r"bytes.jsonl:2: not valid UTF-8"):
        read_tasks(tmp_path / "bytes.jsonl")
    with pytest.raises(DatasetError, match="no such file"):
        read_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "tasks.csv").write_text("prompt\n")
    with pytest.raises(DatasetError, match="set dataset.format"):
        read_tasks(tmp_path / "tasks.csv")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="empty.jsonl: no tasks"):
        load_dataset(DatasetConfig(path=str(tmp_path / "empty.jsonl")))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        read_tasks(tmp_path / "junk.parquet")


def test_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"prompt": ["a", "b", None], "answer": [1, 2, 3]})
    pq.write_table(table.slice(0, 2), tmp_path / "good.parquet")
    pq.write_table(table, tmp_path / "bad.parquet")
    ds = load_dataset(DatasetConfig(path=str(tmp_path / "good.parquet"), shuffle=False))
    assert [ds[0], ds[1]] == [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}]
    with pytest.raises(DatasetError, match=r'bad.parquet:row 3: field "prompt" is null'):
        read_tasks(tmp_path / "bad.parquet", required_fields=["prompt"])


def test_saved_datasets_directory_needs_the_package_or_loads(tmp_path: Path) -> None:
    try:
        import datasets
    except ImportError:
        (tmp_path / "saved").mkdir()
        with pytest.raises(DatasetError, match="needs the datasets package"):
            read_tasks(tmp_path / "saved")
        return
    datasets.Dataset.from_list([{"prompt": "a"}, {"x": 1}]).save_to_disk(tmp_path / "saved")
    with pytest.raises(
        DatasetError, match=r'saved:row 2: (missing field "prompt"|field "prompt" is null)'
    ):
        read_tasks(tmp_path / "saved", required_fields=["prompt"])


def test_shuffle_is_seeded_per_epoch_and_covers_every_row() -> None:
    tasks = [{"k": k} for k in range(50)]
    a = TaskDataset(tasks, source="t", seed=3)
    b = TaskDataset(tasks, source="t", seed=3)
    other = TaskDataset(tasks, source="t", seed=4)
    assert a.epoch_order(0) == b.epoch_order(0)
    assert sorted(a.epoch_order(0)) == list(range(50))
    assert a.epoch_order(0) != list(range(50))
    assert a.epoch_order(1) != a.epoch_order(0)
    assert other.epoch_order(0) != a.epoch_order(0)
    first_epoch = [a.next() for _ in range(50)]
    assert [item.index for item in first_epoch] == b.epoch_order(0)
    assert all(item.task == tasks[item.index] and item.epoch == 0 for item in first_epoch)
    assert a.next().epoch == 1


def test_resume_continues_the_same_sequence() -> None:
    tasks = [{"k": k} for k in range(7)]
    straight = TaskDataset(tasks, source="t", seed=1)
    expected = [straight.next().index for _ in range(20)]

    first = TaskDataset(tasks, source="t", seed=1)
    drawn = [first.next().index for _ in range(9)]  # into the second epoch
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = TaskDataset(tasks, source="t", seed=1)
    resumed.load_state_dict(state)
    assert resumed.position == 9
    drawn += [resumed.next().index for _ in range(11)]
    assert drawn == expected
    assert resumed.at(3).index == expected[3]  # any position can be looked at again


def test_resume_refuses_a_different_dataset() -> None:
    state = TaskDataset([{"k": 0}, {"k": 1}], source="t", seed=1).state_dict()
    with pytest.raises(DatasetError, match="cannot resume"):
        TaskDataset([{"k": 0}], source="t", seed=1).load_state_dict(state)
    with pytest.raises(DatasetError, match="cannot resume"):
        TaskDataset([{"k": 0}, {"k": 1}], source="t", seed=2).load_state_dict(state)


def test_tasks_handed_out_are_copies() -> None:
    ds = TaskDataset([{"k": 0}], source="t")
    ds.next().task["k"] = 99
    assert ds[0] == {"k": 0}


@pytest.mark.parametrize("name", ["arithmetic", "concise", "calculator", "guess"])
def test_generated_tasks_are_seeded(name: str) -> None:
    config = DatasetConfig(generate=name, num_tasks=30, seed=5)
    one, two = load_dataset(config, ["prompt"]), load_dataset(config, ["prompt"])
    assert [one[k] for k in range(30)] == [two[k] for k in range(30)]
    other = load_dataset(DatasetConfig(generate=name, num_tasks=30, seed=6))
    assert [one[k] for k in range(30)] != [other[k] for k in range(30)]
    assert len({json.dumps(one[k]) for k in range(30)}) > 15  # varied, not one task repeated


def test_generated_tasks_are_checked_for_the_environment_fields() -> None:
    with pytest.raises(
        DatasetError, match=r'generated concise tasks:row 1: missing field "answer"'
    ):
        load_dataset(DatasetConfig(generate="concise", num_tasks=3), ["prompt", "answer"])


def test_generated_answers_are_right() -> None:
    from tracerl.envs.expression import evaluate

    for name in ("arithmetic", "calculator"):
        ds = load_dataset(DatasetConfig(generate=name, num_tasks=40))
        for k in range(40):
            task = ds[k]
            expression = task["prompt"].removeprefix("What is ").removesuffix("?")
            assert evaluate(expression) == task["answer"], task


def _signal_dataset(skip: float, seed: int = 0) -> TaskDataset:
    tasks = [{"prompt": f"q{i}", "answer": i} for i in range(4)]
    return TaskDataset(tasks, source="t", seed=seed, shuffle=False, difficulty="signal", skip=skip)


def _first_epoch(data: TaskDataset) -> None:
    """Rows 0 and 2 always solved or never (no signal), rows 1 and 3 mixed."""
    outcomes = {0: [1.0, 1.0], 1: [0.0, 1.0], 2: [0.0, 0.0, None], 3: [1.0, 0.0]}
    for group in range(4):
        data.observe(group, outcomes[data.next(group).index])


def test_tasks_without_signal_are_passed_over_by_the_skip_probability() -> None:
    data = _signal_dataset(skip=1.0)
    _first_epoch(data)
    # from the second epoch on, only the rows whose groups had signal are drawn
    assert [data.next().index for _ in range(6)] == [1, 3, 1, 3, 1, 3]
    assert data.skipped == 6
    uniform = _signal_dataset(skip=1.0)
    uniform.difficulty = "uniform"
    _first_epoch(uniform)
    assert [uniform.next().index for _ in range(4)] == [0, 1, 2, 3] and uniform.skipped == 0


def test_a_partial_skip_is_seeded_and_keeps_some_samples() -> None:
    def draws(seed: int) -> list[int]:
        data = _signal_dataset(skip=0.5, seed=seed)
        _first_epoch(data)
        return [data.next().index for _ in range(400)]

    first = draws(0)
    assert first == draws(0) and first != draws(1)
    counts = {i: first.count(i) for i in range(4)}
    # each of rows 1 and 3 is drawn once an epoch; rows 0 and 2 about half as often
    assert counts[1] == counts[3] and 0.3 < counts[0] / counts[1] < 0.7
    assert 0.3 < counts[2] / counts[1] < 0.7


def test_a_row_regains_its_turns_once_its_group_has_signal() -> None:
    data = _signal_dataset(skip=1.0)
    drawn = [data.next(group).index for group in range(4)]  # rows 0-3, none measured yet
    assert drawn == [0, 1, 2, 3] and data.next(4).index == 0  # a second group of row 0
    data.observe(0, [1.0, 1.0])  # the first ends without signal...
    data.observe(99, [0.0, 1.0])  # (a group the dataset never drew: ignored)
    assert [data.next().index for _ in range(3)] == [1, 2, 3]  # ...so row 0 is passed over
    data.observe(4, [0.0, 1.0])  # ...until its later group has signal
    assert [data.next().index for _ in range(4)] == [0, 1, 2, 3]


def test_when_no_task_has_signal_one_is_still_drawn() -> None:
    data = _signal_dataset(skip=1.0)
    for group in range(4):
        data.next(group)
        data.observe(group, [1.0, 1.0])
    assert data.next().index in range(4)  # bounded search, never a hang
    assert data.skipped == 4  # one full pass over the rows, then the next one is drawn


def test_resume_restores_what_was_measured() -> None:
    data = _signal_dataset(skip=0.5)
    _first_epoch(data)
    [data.next() for _ in range(5)]
    state = json.loads(json.dumps(data.state_dict()))
    resumed = _signal_dataset(skip=0.5)
    resumed.load_state_dict(state)
    assert [resumed.next().index for _ in range(40)] == [data.next().index for _ in range(40)]
    assert resumed.skipped == data.skipped


def _games(difficulty_by: str | None = "high") -> TaskDataset:
    """Twelve games, four of each range, in file order: high 8, 16, 32, 8, 16, 32, ..."""
    tasks = [{"prompt": f"g{i}", "answer": 1, "high": (8, 16, 32)[i % 3]} for i in range(12)]
    return TaskDataset(
        tasks, source="t", shuffle=False, difficulty="signal", skip=1.0, difficulty_by=difficulty_by
    )


def test_signal_by_a_field_acts_within_the_first_epoch() -> None:
    """Games of range 8 always solved: once one group of them says so, the other games of that
    range are passed over, in the epoch where no row has come back yet."""
    data = _games()
    outcome = {8: [1.0, 1.0], 16: [0.0, 1.0], 32: [0.0, 0.0]}
    drawn = []
    for group in range(6):
        item = data.next(group)
        drawn.append(item.index)
        data.observe(group, outcome[item.task["high"]])
    # rows 0-2 measure 8, 16 and 32; then only range 16 has signal: rows 4, 7 and 10
    assert drawn == [0, 1, 2, 4, 7, 10] and data.skipped == 5  # rows 3, 5, 6, 8 and 9
    by_row = _games(difficulty_by=None)  # per row, nothing is measured until rows come back
    for group in range(6):
        item = by_row.next(group)
        by_row.observe(group, outcome[item.task["high"]])
    assert by_row.skipped == 0 and by_row.position == 6


def test_signal_by_a_field_resumes_and_refuses_a_task_without_it() -> None:
    data = _games()
    data.next(0)
    data.observe(0, [1.0, 1.0])  # row 0: range 8 always solved
    state = json.loads(json.dumps(data.state_dict()))
    resumed = _games()
    resumed.load_state_dict(state)
    assert [resumed.next().index for _ in range(3)] == [1, 2, 4]  # row 3 (range 8) passed over
    other_key = _games(difficulty_by=None)
    other_key.load_state_dict(state)  # measured per range: says nothing of rows
    assert [other_key.next().index for _ in range(3)] == [1, 2, 3]
    with pytest.raises(DatasetError, match=r"t:row 2: dataset.difficulty_by = 'high' needs"):
        TaskDataset([{"high": 8}, {"prompt": "x"}], source="t", difficulty_by="high")
    with pytest.raises(ValueError, match="difficulty_by applies to difficulty = 'signal' only"):
        DatasetConfig(path="games.jsonl", difficulty_by="high")
