"""`tracerl train` with vLLM as the engine: the README's command, a few real steps on SmolLM2."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm.conftest import PYTHON, ROOT

pytestmark = pytest.mark.vllm


def test_train_runs_real_steps_with_vllm_generating(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "tracerl.cli.main", "train", "examples/quickstart-vllm.toml",
        "--run-dir", str(run_dir), "--loop.steps=2", "--eval.every=0",
        "--logging.progress=false", f"--engine.python={PYTHON}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["time/weight_sync_s"] > 0 for s in steps)
    # the weight probe ran after each push (SmolLM2 ties its output layer) and passed
    assert all(0 <= s["weights/probe_logprob_diff"] < 2e-4 for s in steps), steps
    assert "Application startup complete" in (run_dir / "logs" / "engine-0.log").read_text()
    assert (run_dir / "weights" / "model.safetensors").is_file()  # what vLLM reloaded
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        versions = {
            json.loads(data)["weight_version"] for (data,) in db.execute("SELECT data FROM turns")
        }
    assert 0 in versions and max(versions) >= 1  # rollouts on the base and the trained weights
