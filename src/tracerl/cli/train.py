"""`tracerl train`: the run directory, then the RL loop (`tracerl.run.loop`)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from tracerl import eventloop
from tracerl.config import ConfigError, TrainCommandConfig


def prepare_run_dir(config_path: str, run_dir: str | None, resume: bool) -> Path:
    """`--run-dir`, or runs/<config name>. A fresh run refuses a directory that already holds a
    run (it would mix two runs' metrics and checkpoints); `--resume` requires one."""
    path = Path(run_dir) if run_dir else Path("runs") / Path(config_path).stem
    has_run = (path / "metrics.jsonl").exists() or (path / "checkpoints").exists()
    if resume and not (path / "checkpoints").exists():
        raise ConfigError(f"--resume: {path} has no checkpoints to resume from")
    if not resume and has_run:
        raise ConfigError(
            f"--run-dir: {path} already holds a run; pass --resume to continue it, or choose "
            "another directory"
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_train(config: TrainCommandConfig, run_dir: Path, resume: bool = False) -> int:
    from tracerl.run.loop import RLLoop
    from tracerl.run.probe import WeightProbeError

    with contextlib.suppress(KeyboardInterrupt):
        try:
            return eventloop.run(RLLoop(config, run_dir, resume).run())
        except WeightProbeError as e:  # the run's own words; the traceback adds nothing
            print(f"tracerl train: {e}", file=sys.stderr)
            return 1
    return 130
