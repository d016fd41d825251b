"""`tracerl sft` as a user runs it, on the `tiny` model: a conversation dataset trained to a lower
loss and exported; killed with SIGKILL mid-run and resumed, it ends with the same weights and the
same per-step losses as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
STEPS = 30


def dataset(path: Path) -> Path:
    rows = []
    for a in range(24):
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"What is {a} plus {a + 1}?"},
                    {"role": "assistant", "content": f"{a} plus {a + 1} is {2 * a + 1}."},
                ]
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(tmp_path: Path) -> Path:
    path = tmp_path / "sft.toml"
    path.write_text(
        f"""
[trainer]
model = "tiny"
token_budget = 512
[trainer.actor]
lr = 1e-3
schedule = "cosine"
[data]
path = "{dataset(tmp_path / "data.jsonl")}"
[sft]
steps = {STEPS}
batch_size = 4
checkpoint_every = 3
[logging]
progress = false
"""
    )
    return path


def sft(cfg: Path, run_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracerl.cli.main",
            "sft",
            str(cfg),
            "--run-dir",
            str(run_dir),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )


def losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.endswith("}")]
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps)), f"a step logged twice or out of order: {steps}"
    return {r["step"]: r["actor/sft_loss"] for r in records}


def test_sft_learns_exports_and_resumes_exactly_after_sigkill(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    whole = tmp_path / "whole"
    proc = sft(cfg, whole)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    reference = losses(whole)
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert reference[STEPS] < 0.75 * reference[1]  # it learned the dataset
    assert (whole / "export" / "model.safetensors").exists()

    killed = tmp_path / "killed"
    proc = sft(cfg, killed)
    deadline = time.monotonic() + 300
    while not ((killed / "metrics.jsonl").exists() and len(losses(killed)) >= 5):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no 5 steps within 300 s"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert len(losses(killed)) < STEPS  # killed mid-run
    resumed = sft(cfg, killed, "--resume")
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "resumed at step" in out
    assert losses(killed) == reference  # every step once, trained as in the whole run
    final, expected = (load_file(d / "export" / "model.safetensors") for d in (killed, whole))
    assert final.keys() == expected.keys()
    assert all(final[k].equal(expected[k]) for k in expected)
