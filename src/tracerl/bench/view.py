"""`tracerl bench view`: how long `tracerl view` takes to show the episode list of a run of
100k sessions, from the start of its process (interpreter start-up, imports and the episode
index built from `episodes.jsonl` included) to the first page's last byte.

The run directory is generated here: a `traces.sqlite` in the gateway's schema with 100k
sessions of one turn each, written in one transaction, and the `episodes.jsonl`, `metrics.jsonl`
and `config.json` a training run leaves. Then, against the same warm server: a filtered page
(group, reward range) and the last page. Target: the first page within 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tracerl.gateway.store import SCHEMA
from tracerl.run.episode_log import EPISODES_FILE

SESSIONS = 100_000
GROUP_SIZE = 4
TARGET_S = 1.0
"""The issue's bound: a store of 100k sessions opens its episode list in under a second."""


def make_run(run_dir: Path, sessions: int) -> None:
    """A run directory with `sessions` one-turn sessions and their episode lines."""
    rng = random.Random(0)
    turn = json.dumps(
        {
            "index": 0,
            "endpoint": "chat.completions",
            "prompt_ids": list(range(40)),
            "completion_ids": list(range(100, 124)),
            "completion_logprobs": [-0.5] * 24,
            "finish_reason": "stop",
            "weight_version": 0,
            "request": {"messages": [{"role": "user", "content": "Say something short."}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
        }
    )
    db = sqlite3.connect(run_dir / "traces.sqlite")
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    now = time.time()
    ids = [f"s{i:07d}" for i in range(sessions)]
    with db:
        db.executemany(
            "INSERT INTO sessions VALUES (?,?,?,?,?)",
            ((sid, "x", "closed", now, "{}") for sid in ids),
        )
        db.executemany("INSERT INTO turns VALUES (?,?,?,?)", ((sid, 0, turn, now) for sid in ids))
    db.close()
    with (run_dir / EPISODES_FILE).open("w") as f:
        for i, sid in enumerate(ids):
            group, step = i // GROUP_SIZE, i // 256
            failed = rng.random() < 0.02
            line = {
                "session_id": sid, "episode": f"g{group}-{i % GROUP_SIZE}", "step": step,
                "version": step, "env": "concise", "kind": "train", "group": group,
                "reward": None if failed else round(rng.random(), 3), "failed": failed,
                "reason": "timeout" if failed else None, "tokens": 24, "duration_s": 0.1,
            }  # fmt: skip
            f.write(json.dumps(line) + "\n")
    with (run_dir / "metrics.jsonl").open("w") as f:
        for step in range(1, sessions // 256 + 1):
            f.write(json.dumps({"step": step, "rollout/reward_mean": rng.random()}) + "\n")
    config = {"trainer": {"model": "tiny", "algorithm": "grpo"}, "env": {"name": "concise"}}
    (run_dir / "config.json").write_text(json.dumps(config))


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read()


def _timed(url: str, listing: bytes = b"episode-rows") -> float:
    """Seconds to fetch an episode page at `url`, which must hold `listing`."""
    started = time.perf_counter()
    status, body = _get(url)
    if status != 200 or listing not in body:
        raise RuntimeError(f"{url}: {status}, not the episode list expected ({listing!r})")
    return time.perf_counter() - started


def first_page_s(run_dir: Path, sessions: int) -> tuple[float, float, str, subprocess.Popen[str]]:
    """Seconds from spawning `tracerl view` to its listening (printed URL) and to its first
    episode page (which must count all `sessions`); the URL and the process."""
    command = [sys.executable, "-m", "tracerl.cli.main", "view", str(run_dir), "--port", "0"]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert process.stdout is not None
    line = process.stdout.readline()
    if " on http" not in line:
        process.kill()
        raise RuntimeError(f"tracerl view did not start: {line!r}")
    listening_s = time.perf_counter() - started
    url = line.split(" on ", 1)[1].split()[0]
    _timed(url + "episodes", f"<span id=episode-count>{sessions}</span>".encode())
    return listening_s, time.perf_counter() - started, url, process


def main(args: argparse.Namespace) -> int:
    sessions = 2_000 if getattr(args, "quick", False) else SESSIONS
    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        run_dir = Path(tmp)
        made = time.perf_counter()
        make_run(run_dir, sessions)
        generate_s = time.perf_counter() - made
        listening_s, first_s, url, process = first_page_s(run_dir, sessions)
        try:
            filtered_s = _timed(url + "episodes?group=7&reward_min=0.1&reward_max=0.9")
            last_page = (sessions - 1) // 50
            last_s = _timed(url + f"episodes?page={last_page}")
            session_s = _timed_session(url)
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(
        json.dumps(
            {
                "bench": "view",
                "sessions": sessions,
                "generate_s": round(generate_s, 3),
                "listening_s": round(listening_s, 3),
                "first_episode_page_s": round(first_s, 3),
                "filtered_page_s": round(filtered_s, 3),
                "last_page_s": round(last_s, 3),
                "session_json_s": round(session_s, 3),
                "target_first_page_s": TARGET_S,
                "target_met": first_s < TARGET_S,
            }
        ),
        flush=True,
    )
    return 0


def _timed_session(url: str) -> float:
    """One session's trace JSON from the middle of the store (a primary-key read)."""
    started = time.perf_counter()
    status, body = _get(url + "api/sessions/s0000777")
    if status != 200 or b'"turns"' not in body:
        raise RuntimeError(f"session JSON: {status}")
    return time.perf_counter() - started
