"""Each adapter's shipped example through `tracerl train` on the `tiny` model: two steps from
the environment's own tasks, every episode's model calls recorded turns, the rewards the
environment's. verifiers and OpenEnv carry the `envs` marker (`make test-envs`)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
NEEDS = {
    "reasoning_gym": "reasoning_gym",
    "textarena": "textarena",
    "verifiers": "verifiers",
    "openenv": "openenv.core",
}


@pytest.mark.parametrize(
    "example",
    [
        "reasoning_gym",
        "textarena",
        pytest.param("verifiers", marks=pytest.mark.envs),
        pytest.param("openenv", marks=pytest.mark.envs),
    ],
)
def test_the_example_trains_two_steps(example: str, tmp_path: Path) -> None:
    pytest.importorskip(NEEDS[example])
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "tracerl.cli.main", "train", f"examples/envs/{example}.toml",
        "--run-dir", str(run_dir), "--trainer.model=tiny", "--loop.steps=2", "--eval.every=2",
        "--eval_dataset.num_tasks=4", "--orchestrator.batch_size=8", "--logging.progress=false",
        "--cold_start.demonstrations=0",
    ]  # fmt: skip
    if example != "reasoning_gym":  # the others have no [cold_start] section to switch off
        command.remove("--cold_start.demonstrations=0")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'examples/envs'}"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in lines if "rollout/episodes" in s] == [1, 2]  # past the evals
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    train = [e for e in episodes if e["kind"] == "train"]
    assert len(train) >= 16 and not any(e["failed"] for e in episodes)
    assert all(isinstance(e["reward"], float) for e in train)
    db = sqlite3.connect(run_dir / "traces.sqlite")
    recorded = dict(db.execute("select session_id, count(*) from turns group by session_id"))
    for e in episodes:  # every episode played through the gateway, every call recorded
        assert recorded.get(e["session_id"], 0) >= 1, e
