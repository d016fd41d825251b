"""`tracerl train`: the run directory, the cold start if configured (`tracerl.run.cold_start`),
then the RL loop (`tracerl.run.loop`)."""

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
    started = (path / "checkpoints").exists() or (path / "cold_start").exists()
    has_run = (path / "metrics.jsonl").exists() or started
    if resume and not started:
        raise ConfigError(f"--resume: {path} has no checkpoints to resume from")
    if not resume and has_run:
        raise ConfigError(
            f"--run-dir: {path} already holds a run; pass --resume to continue it, or choose "
            "another directory"
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_train(config: TrainCommandConfig, run_dir: Path, resume: bool = False) -> int:
    from tracerl.run.cold_start import cold_start
    from tracerl.run.loop import RLLoop
    from tracerl.run.probe import WeightProbeError
    from tracerl.train.checkpoint import latest_checkpoint

    with contextlib.suppress(KeyboardInterrupt):
        config = cold_start(config, run_dir)
        resume = resume and latest_checkpoint(run_dir / "checkpoints") is not None
        try:
            return eventloop.run(RLLoop(config, run_dir, resume).run())
        except WeightProbeError as e:  # the run's own words; the traceback adds nothing
            print(f"tracerl train: {e}", file=sys.stderr)
            return 1
    return 130
