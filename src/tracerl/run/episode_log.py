"""The run's episode records: `episodes.jsonl`, one line per ended episode, with what the trace
store does not hold (the step it ended at, the weight version that sampled it, its environment,
group, reward, and why it failed), which `tracerl view` reads to list and filter episodes
without ever writing to the run; and `episodes_failed.jsonl`, one line per failed episode with
its reason (failed episodes never reach the trainer; their turns are in the trace store).

Each line is written and flushed on its own, so a run killed with `kill -9` loses at most the
line being written (the viewer reads only complete lines). Owns the file's format; not what the
loop does with episodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracerl.run.rollouts import Rollout

EPISODES_FILE = "episodes.jsonl"
FAILED_FILE = "episodes_failed.jsonl"


def read_episodes(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete line of RUN_DIR/episodes.jsonl (none when the file is missing); a line a
    killed run was writing is skipped."""
    path = run_dir / EPISODES_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the line a killed run was writing
    return rows


class EpisodeLog:
    """Appends one JSON line per ended episode to RUN_DIR/episodes.jsonl."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / EPISODES_FILE
        self._file: IO[str] | None = self.path.open("a")

    def record(self, rollout: Rollout, episode: str, step: int, env: str) -> None:
        """`rollout`, ended while the loop was at `step`; one line, flushed at once so a killed
        run keeps every line it wrote, and a line in episodes_failed.jsonl if it failed. An
        episode that never opened a session has nothing to show in episodes.jsonl (its failure
        line keeps it)."""
        result = rollout.result
        if result.failed:
            self._failed(rollout, episode, step)
        if self._file is None or rollout.session_id is None:
            return
        line = {
            "session_id": rollout.session_id,
            "episode": episode,
            "step": step,
            "version": rollout.version,
            "env": env,
            "kind": rollout.kind,
            "group": rollout.group,
            "reward": result.reward,
            "failed": result.failed or result.reward is None,
            "reason": result.reason,
            "tokens": rollout.tokens,
            "duration_s": round(result.duration_s, 3),
        }
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def _failed(self, rollout: Rollout, episode: str, step: int) -> None:
        record = {
            "step": step,
            "episode": episode,
            "kind": rollout.kind,
            "session_id": rollout.session_id,
            "reason": rollout.result.reason,
            "duration_s": round(rollout.result.duration_s, 3),
        }
        with (self.path.parent / FAILED_FILE).open("a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
