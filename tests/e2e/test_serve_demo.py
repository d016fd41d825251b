"""`tracerl serve --demo` with the real SmolLM2-135M-Instruct: one chat turn, answered."""

from __future__ import annotations

import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "tracerl.cli.main"]


@pytest.mark.e2e
def test_serve_demo_answers_with_smollm2() -> None:
    out = subprocess.run(
        [*CLI, "serve", "--model", "smollm2-135m", "--port", "0", "--demo"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    answer = next(line for line in out.stdout.splitlines() if line.startswith("answer"))
    assert "Paris" in answer
