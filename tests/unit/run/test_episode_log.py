"""`episodes.jsonl`: each ended episode is on disk as soon as it is recorded (a `kill -9` of
the run loses none), failed ones with their reason, also in `episodes_failed.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path

from tracerl.envs import EpisodeResult
from tracerl.run.episode_log import EpisodeLog
from tracerl.run.rollouts import Rollout


def test_each_line_is_flushed_when_recorded(tmp_path: Path) -> None:
    log = EpisodeLog(tmp_path)
    ok = Rollout(3, "train", EpisodeResult(0.5, duration_s=1.23456), session_id="a", tokens=7,
                 version=2)  # fmt: skip
    log.record(ok, "g3-1", step=4, env="concise")
    # read by another handle before close: what a killed run leaves
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {
        "session_id": "a", "episode": "g3-1", "step": 4, "version": 2, "env": "concise",
        "kind": "train", "group": 3, "reward": 0.5, "failed": False, "reason": None,
        "tokens": 7, "duration_s": 1.235,
    }  # fmt: skip
    failed = Rollout(3, "eval", EpisodeResult(None, failed=True, reason="timeout"),
                     session_id="b")  # fmt: skip
    log.record(failed, "g3-2", step=4, env="concise")
    no_session = Rollout(3, "train", EpisodeResult(None, failed=True, reason="gateway down"))
    log.record(no_session, "g3-3", step=4, env="concise")  # nothing to show: left out
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["failed"] is True and json.loads(lines[1])["reason"] == "timeout"
    # both failures in episodes_failed.jsonl, the one without a session too
    failures = [
        json.loads(x) for x in (tmp_path / "episodes_failed.jsonl").read_text().split("\n")[:-1]
    ]
    assert [(f["episode"], f["session_id"], f["reason"]) for f in failures] == [
        ("g3-2", "b", "timeout"),
        ("g3-3", None, "gateway down"),
    ]
    log.close()
    log.record(ok, "g3-1", step=4, env="concise")  # after close: ignored, no error
