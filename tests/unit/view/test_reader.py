"""The viewer's reading of a run directory: JSON lines followed as they grow (torn and partial
lines, a rewritten file), the episode index and its filters, and the store opened read-only."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.viewer_run import make_run
from tracerl.view.reader import (
    EpisodeFilter,
    JsonlTail,
    RunReader,
    RunUnreadable,
    StoreReader,
    parse_filter,
)


def test_tail_waits_for_a_partial_line_and_counts_a_torn_one(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == ([], False)  # no file yet
    path.write_text('{"step": 1}\n{"step": 2, "x"\n{"step": 3}\n{"step": 4')
    records, restarted = tail.read_new()
    assert [r["step"] for r in records] == [1, 3] and not restarted
    assert tail.bad_lines == [2] and tail.pending_bytes == len('{"step": 4')
    with path.open("a") as f:
        f.write(', "y": 1}\n')  # the writer finishes the line
    records, _ = tail.read_new()
    assert records == [{"step": 4, "y": 1}] and tail.pending_bytes == 0


def test_tail_starts_over_when_the_file_is_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    tail = JsonlTail(path)
    assert len(tail.read_new()[0]) == 2
    tmp = tmp_path / "metrics.tmp"  # as truncate_metrics does on resume
    tmp.write_text('{"step": 1}\n')
    tmp.replace(path)
    records, restarted = tail.read_new()
    assert restarted and records == [{"step": 1}]


def test_metrics_problems_name_the_truncated_line(tmp_path: Path) -> None:
    reader = RunReader(tmp_path)
    reader.refresh()
    assert any("not written yet" in p for p in reader.metrics.problems())
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "a\n{"step": 3}\n')
    reader.refresh()
    assert [r["step"] for r in reader.metrics.records] == [1, 3]
    assert reader.metrics.problems() == ["metrics.jsonl: skipped unreadable (truncated?) line(s) 2"]


async def test_episode_index_filters_and_pages(tmp_path: Path) -> None:
    await make_run(tmp_path)
    reader = RunReader(tmp_path)
    reader.refresh()
    index = reader.episodes
    total, rows = index.query(EpisodeFilter(), 0, 2)  # newest first
    assert total == 4 and [r["session_id"] for r in rows] == ["s-empty", "s-anthropic"]
    total, rows = index.query(EpisodeFilter(), 1, 2)
    assert [r["session_id"] for r in rows] == ["s-fork", "s-tools"]
    assert index.query(EpisodeFilter(), 2, 2) == (4, [])
    total, rows = index.query(EpisodeFilter(failed=True), 0, 10)
    assert [r["session_id"] for r in rows] == ["s-empty"]
    assert index.reason(rows[0]) == "timeout after 5 s"
    _, rows = index.query(EpisodeFilter(reward_min=0.25, reward_max=1.0), 0, 10)
    assert {r["session_id"] for r in rows} == {"s-tools", "s-anthropic"}
    _, rows = index.query(EpisodeFilter(group=0, version=1, env="calculator"), 0, 10)
    assert [r["session_id"] for r in rows] == ["s-fork"]
    assert [r["session_id"] for r in index.group(0)] == ["s-tools", "s-fork", "s-anthropic"]
    assert index.session("s-empty") is not None and index.choices()["env"] == ["calculator"]
    # new lines appear on the next refresh
    with (tmp_path / "episodes.jsonl").open("a") as f:
        f.write(json.dumps({"session_id": "s-new", "group": 0, "step": 9}) + "\n")
    reader.refresh()
    assert index.query(EpisodeFilter(step=9), 0, 10)[1][0]["session_id"] == "s-new"
    assert len(index.group(0)) == 4


def test_parse_filter_names_what_it_cannot_use() -> None:
    wanted, errors = parse_filter({"step": "3", "failed": "yes", "reward_min": "x", "env": "a"})
    assert wanted == EpisodeFilter(step=3, failed=True, env="a")
    assert errors == ["filter reward_min=x ignored: not a valid value"]


async def test_store_is_opened_read_only(tmp_path: Path) -> None:
    sessions = await make_run(tmp_path)
    store = StoreReader(tmp_path)
    trace = store.trace("s-fork")
    assert trace is not None and trace.status == "open"
    assert [t.turn_indices for t in trace.trajectories] == [[0, 1], [2]]
    assert trace.turns == sessions["s-fork"]
    assert store.trace("nope") is None
    counts = store.summaries(["s-tools", "s-empty", "nope"])
    assert {k: v.turns for k, v in counts.items()} == {"s-tools": 2, "s-empty": 0}
    db = store._connect()
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        db.execute("DELETE FROM sessions")
    db.close()
    total, recent = store.recent_sessions(0, 2)
    assert total == 4 and [s.session_id for s in recent] == ["s-empty", "s-anthropic"]


def test_a_missing_store_or_tables_say_so(tmp_path: Path) -> None:
    store = StoreReader(tmp_path)
    with pytest.raises(RunUnreadable, match="not in the run directory"):
        store.trace("x")
    sqlite3.connect(tmp_path / "traces.sqlite").close()  # created, schema not yet written
    with pytest.raises(RunUnreadable, match="being created"):
        store.trace("x")


async def test_reads_a_store_while_the_gateway_writes_it(tmp_path: Path) -> None:
    from tests.viewer_run import turn
    from tracerl.gateway.store import SQLiteTraceStore

    writer = SQLiteTraceStore(tmp_path / "traces.sqlite")  # open: its -wal and -shm exist
    try:
        await writer.create_session("live", "h", {})
        await writer.append_turn("live", turn(0, [1], [2]))
        reader = StoreReader(tmp_path)
        first = reader.trace("live")
        assert first is not None and len(first.turns) == 1 and first.status == "open"
        await writer.append_turn("live", turn(1, [1, 2, 3], [4], parent=0))  # not blocked
        await writer.close_session("live")
        second = reader.trace("live")
        assert second is not None and len(second.turns) == 2 and second.status == "closed"
    finally:
        await writer.close()
