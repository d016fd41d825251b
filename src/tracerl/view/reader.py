"""Read-only access to a run directory for the viewer, while a run may still be writing it.

Owns: following the run's JSON-lines files (`metrics.jsonl`, `episodes.jsonl`,
`episodes_failed.jsonl`) from where the last read stopped, the in-memory episode index the
episode list and its filters query, and reading sessions from `traces.sqlite` opened read-only
(`mode=ro`: the viewer never writes to the run, nor takes a lock that could hold up the
gateway's commits). Not: HTML, HTTP, or token text (`tracerl.view.tokens`).

The episode list never scans the store: a page's facts come from the index (built from
`episodes.jsonl` as it grows, so opening a run of 100k episodes reads one file once) and the
store is asked only about that page's sessions, by primary key.
"""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tracerl.run.episode_log import EPISODES_FILE, FAILED_FILE
from tracerl.trace.schema import SessionTrace, Turn
from tracerl.trace.trajectories import TraceError, session_trace

METRICS_FILE = "metrics.jsonl"
GROUPS_FILE = "groups.jsonl"
STORE_FILE = "traces.sqlite"
CONFIG_FILE = "config.json"


class RunUnreadable(RuntimeError):
    """Something of the run cannot be read now; the message is shown on the page."""


class JsonlTail:
    """A JSON-lines file read from where the last read stopped. A line still being written (no
    newline yet) waits for the next read; a complete line that is not a JSON object (cut by a
    killed writer) is counted, by line number, and skipped. A file replaced or shortened (a
    resumed run rewrites `metrics.jsonl`) is read again from the start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bad_lines: list[int] = []
        """1-based numbers of complete lines that were not JSON objects."""
        self.pending_bytes = 0
        """Bytes after the last newline: a line being written (or torn at the end)."""
        self._offset = 0
        self._lines = 0
        self._inode: int | None = None

    def read_lines(self) -> tuple[list[bytes], bool]:
        """The lines completed since the last call, unparsed, and whether the file was started
        over (the caller drops what it kept)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            restarted = self._inode is not None
            self._reset(None)
            return [], restarted
        restarted = self._inode is not None and (
            stat.st_ino != self._inode or stat.st_size < self._offset
        )
        if restarted or self._inode is None:
            self._reset(stat.st_ino)
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.pending_bytes = len(data) - end
        self._offset += end
        return data[:end].splitlines(), restarted

    def read_new(self) -> tuple[list[dict[str, Any]], bool]:
        """`read_lines`, parsed: the records of the new lines (bad ones counted)."""
        lines, restarted = self.read_lines()
        records = []
        for record in parse_lines(lines):
            self._lines += 1
            if isinstance(record, dict):
                records.append(record)
            else:
                self.bad_lines.append(self._lines)
        return records, restarted

    def _reset(self, inode: int | None) -> None:
        self._inode, self._offset, self._lines = inode, 0, 0
        self.bad_lines, self.pending_bytes = [], 0


def parse_lines(lines: list[bytes]) -> list[Any]:
    """Each line's JSON value, None for a line that is not JSON. One parse of them all where
    every line is whole (100k lines in a fraction of a second), else line by line."""
    try:
        return list(orjson.loads(b"[" + b",".join(lines) + b"]")) if lines else []
    except orjson.JSONDecodeError:
        return [_loads(raw) for raw in lines]


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


class MetricsSeries:
    """`metrics.jsonl` as it grows: every step record read so far."""

    def __init__(self, run_dir: Path) -> None:
        self.tail = JsonlTail(run_dir / METRICS_FILE)
        self.records: list[dict[str, Any]] = []

    def refresh(self) -> None:
        new, restarted = self.tail.read_new()
        if restarted:
            self.records = []
        self.records += [r for r in new if isinstance(r.get("step"), int | float)]

    def problems(self) -> list[str]:
        out = []
        if not self.tail.path.exists():
            out.append(f"{METRICS_FILE}: not written yet (no step has ended)")
        if self.tail.bad_lines:
            lines = ", ".join(str(n) for n in self.tail.bad_lines[:5])
            out.append(f"{METRICS_FILE}: skipped unreadable (truncated?) line(s) {lines}")
        return out


@dataclass(frozen=True)
class EpisodeFilter:
    """What the episode list shows; None: any."""

    step: int | None = None
    version: int | None = None
    env: str | None = None
    kind: str | None = None
    group: int | None = None
    failed: bool | None = None
    reward_min: float | None = None
    reward_max: float | None = None

    def matches(self, row: dict[str, Any]) -> bool:
        reward = row.get("reward")
        return (
            (self.step is None or row.get("step") == self.step)
            and (self.version is None or row.get("version") == self.version)
            and (self.env is None or row.get("env") == self.env)
            and (self.kind is None or row.get("kind") == self.kind)
            and (self.group is None or row.get("group") == self.group)
            and (self.failed is None or bool(row.get("failed")) == self.failed)
            and (self.reward_min is None or (reward is not None and reward >= self.reward_min))
            and (self.reward_max is None or (reward is not None and reward <= self.reward_max))
        )


INT_FILTERS = ("step", "version", "group")
FLOAT_FILTERS = ("reward_min", "reward_max")
TEXT_FILTERS = ("env", "kind")


def parse_filter(query: dict[str, str]) -> tuple[EpisodeFilter, list[str]]:
    """The filter a page's query string asks for, and a message per value it cannot use."""
    values: dict[str, Any] = {}
    errors = []
    for name in (*INT_FILTERS, *FLOAT_FILTERS, *TEXT_FILTERS, "failed"):
        text = query.get(name, "").strip()
        if not text:
            continue
        try:
            if name in INT_FILTERS:
                values[name] = int(text)
            elif name in FLOAT_FILTERS:
                values[name] = float(text)
            elif name == "failed":
                values[name] = {"yes": True, "no": False}[text]
            else:
                values[name] = text
        except (ValueError, KeyError):
            errors.append(f"filter {name}={text} ignored: not a valid value")
    return EpisodeFilter(**values), errors


class EpisodeIndex:
    """Every episode of `episodes.jsonl` in memory, with the failure reasons of
    `episodes_failed.jsonl` (which also covers runs from before `episodes.jsonl` existed).
    The lookups by session and by group are built when first asked for after new lines came
    (the episode list itself needs neither, so opening a big run does not wait for them)."""

    def __init__(self, run_dir: Path) -> None:
        self.reasons: dict[str, str] = {}
        self.outcomes: dict[int, dict[str, Any]] = {}
        """Each ended group's line of `groups.jsonl`: trained at a step, or why it never was."""
        self._episodes = JsonlTail(run_dir / EPISODES_FILE)
        self._failed = JsonlTail(run_dir / FAILED_FILE)
        self._groups = JsonlTail(run_dir / GROUPS_FILE)
        self._lines: list[bytes] = []
        """Every complete line, unparsed: the unfiltered list parses only its page's lines."""
        self._rows: list[dict[str, Any]] = []
        """The lines parsed so far (the first `_parsed` lines; unreadable ones left out)."""
        self._parsed = 0
        self._by_session: dict[str, dict[str, Any]] = {}
        self._by_group: dict[int, list[dict[str, Any]]] = {}
        self._indexed = 0
        """How many of `_rows` the lookups hold."""
        self._choices: tuple[int, dict[str, list[Any]]] = (-1, {})

    @property
    def present(self) -> bool:
        return self._episodes.path.exists()

    def refresh(self) -> None:
        new, restarted = self._episodes.read_lines()
        if restarted:
            self._lines, self._rows, self._parsed = [], [], 0
            self._by_session, self._by_group, self._indexed = {}, {}, 0
        self._lines += new
        failed, _ = self._failed.read_new()
        for record in failed:
            if isinstance(record.get("session_id"), str) and record.get("reason"):
                self.reasons[record["session_id"]] = str(record["reason"])
        groups, _ = self._groups.read_new()
        for record in groups:
            if isinstance(record.get("group"), int):
                self.outcomes[record["group"]] = record

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every episode, oldest first (lines not yet parsed are parsed now)."""
        if self._parsed < len(self._lines):
            parsed = parse_lines(self._lines[self._parsed :])
            self._rows += [r for r in parsed if _is_episode(r)]
            self._parsed = len(self._lines)
        return self._rows

    def _index(self) -> None:
        rows = self.rows
        for row in rows[self._indexed :]:
            self._by_session[row["session_id"]] = row
            group = row.get("group")
            if isinstance(group, int):
                self._by_group.setdefault(group, []).append(row)
        self._indexed = len(rows)

    def session(self, session_id: str) -> dict[str, Any] | None:
        self._index()
        return self._by_session.get(session_id)

    def group(self, group: int) -> list[dict[str, Any]]:
        self._index()
        return self._by_group.get(group, [])

    def reason(self, row: dict[str, Any]) -> str | None:
        return row.get("reason") or self.reasons.get(row["session_id"])

    def query(
        self, wanted: EpisodeFilter, page: int, size: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """How many episodes match, and page `page` (0-based) of them, newest first."""
        if wanted == EpisodeFilter():  # no filter: this page's lines only, parsed once
            end = len(self._lines) - page * size
            chunk = self._lines[max(0, end - size) : max(0, end)]
            return len(self._lines), [r for r in reversed(parse_lines(chunk)) if _is_episode(r)]
        matching = [r for r in reversed(self.rows) if wanted.matches(r)]
        return len(matching), matching[page * size : (page + 1) * size]

    def choices(self) -> dict[str, list[Any]]:
        """The values the text filters take among the episodes parsed so far (the form's
        suggestions: they never make the first page wait for every line to be parsed)."""
        if self._choices[0] != len(self._rows):
            values = {name: sorted({str(r.get(name)) for r in self._rows}) for name in TEXT_FILTERS}
            self._choices = (len(self._rows), values)
        return self._choices[1]


def _is_episode(record: Any) -> bool:
    return isinstance(record, dict) and isinstance(record.get("session_id"), str)


@dataclass(frozen=True)
class SessionSummary:
    session_id: str
    status: str
    turns: int
    created: float


SUMMARY_SQL = (
    "SELECT s.id, s.status, s.created, "
    "(SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id) FROM sessions s"
)
"""A session's summary; its turns are counted on the turns table's primary key."""


def _summary(row: tuple[Any, ...]) -> SessionSummary:
    return SessionSummary(row[0], row[1], int(row[3]), float(row[2]))


class StoreReader:
    """`traces.sqlite`, opened read-only for each read (a new connection costs well under a
    millisecond, and sees the file even when it appeared after the viewer started)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / STORE_FILE

    def _connect(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise RunUnreadable(f"{STORE_FILE}: not in the run directory (no session yet)")
        # A writer holds the -wal and -shm files while it has the store open: read alongside
        # it. Without them nobody writes, and a read-only connection would create both (files
        # in the run directory): read the file as immutable, which creates nothing.
        live = self.path.with_name(self.path.name + "-wal").exists()
        mode = "mode=ro" if live else "mode=ro&immutable=1"
        uri = f"file:{urllib.parse.quote(str(self.path.resolve()))}?{mode}"
        try:
            db = sqlite3.connect(uri, uri=True, timeout=5.0, check_same_thread=False)
            db.execute("PRAGMA query_only=ON")
        except sqlite3.Error as e:
            raise RunUnreadable(f"{STORE_FILE}: cannot be opened read-only ({e})") from e
        return db

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        db = self._connect()
        try:
            return db.execute(sql, tuple(params)).fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                raise RunUnreadable(f"{STORE_FILE}: being created (no tables yet)") from e
            raise RunUnreadable(f"{STORE_FILE}: busy or unreadable now ({e}); retrying") from e
        finally:
            db.close()

    def summaries(self, session_ids: list[str]) -> dict[str, SessionSummary]:
        """Status and turn count of each of `session_ids` (by primary key: no scan)."""
        if not session_ids:
            return {}
        marks = ",".join("?" * len(session_ids))
        rows = self._read(f"{SUMMARY_SQL} WHERE s.id IN ({marks})", session_ids)
        return {r[0]: _summary(r) for r in rows}

    def recent_sessions(self, page: int, size: int) -> tuple[int, list[SessionSummary]]:
        """A store without `episodes.jsonl` (a `tracerl serve` capture): its sessions, newest
        first, a page at a time."""
        total = int(self._read("SELECT COUNT(*) FROM sessions")[0][0])
        rows = self._read(
            f"{SUMMARY_SQL} ORDER BY s.rowid DESC LIMIT ? OFFSET ?", (size, page * size)
        )
        return total, [_summary(r) for r in rows]

    def trace(self, session_id: str) -> SessionTrace | None:
        """The session as `GET /sessions/{id}` gives it (the trace schema); None if unknown."""
        found = self._read("SELECT status FROM sessions WHERE id = ?", (session_id,))
        if not found:
            return None
        rows = self._read("SELECT data FROM turns WHERE session_id = ? ORDER BY idx", (session_id,))
        turns = [Turn.model_validate_json(r[0]) for r in rows]
        try:
            return session_trace(session_id, found[0][0], turns)
        except TraceError as e:
            raise RunUnreadable(f"session {session_id}: {e}") from e


class RunReader:
    """Everything the viewer shows of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.metrics = MetricsSeries(run_dir)
        self.episodes = EpisodeIndex(run_dir)
        self.store = StoreReader(run_dir)

    def refresh(self) -> None:
        """Pick up what the run appended since the last call (cheap when nothing was)."""
        if self.run_dir.is_dir():
            self.metrics.refresh()
            self.episodes.refresh()

    def missing(self) -> str | None:
        """Why there is nothing to show at all, or None."""
        if not self.run_dir.exists():
            return f"run directory {self.run_dir} does not exist"
        if not self.run_dir.is_dir():
            return f"{self.run_dir} is not a directory"
        return None

    def config(self) -> dict[str, Any] | None:
        try:
            loaded = json.loads((self.run_dir / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def model_name(self) -> str | None:
        """The model whose tokenizer the run's tokens are in (train, serve or gateway config)."""
        config = self.config() or {}
        for section in ("trainer", "gateway", "engine"):
            model = (config.get(section) or {}).get("model")
            if isinstance(model, str):
                return model
        return None
