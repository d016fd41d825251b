"""Where step metrics go: `metrics.jsonl` in the run directory (always), TensorBoard and Weights &
Biases (when configured), and a progress line on the terminal.

`metrics.jsonl` holds one JSON object per line with at least `step`; a resumed run first drops
the lines of steps after its checkpoint (they were never checkpointed, so they will run again),
so the file never holds a step twice.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from tracerl.config import ConfigError
from tracerl.config.run import LoggingConfig


def _records(lines: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Each readable line of a metrics file with its record; a line torn by a kill mid-write is
    skipped."""
    out = []
    for line in lines:
        try:
            out.append((line, json.loads(line)))
        except ValueError:
            continue
    return out


def truncate_metrics(path: Path, last_step: int) -> int:
    """Keep only the lines of steps <= `last_step` (and unreadable tails are cut); returns how
    many lines were dropped."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line, record in _records(lines) if int(record.get("step", 0)) <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    tmp.replace(path)
    return len(lines) - len(kept)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [record for _, record in _records(path.read_text().splitlines())]


class MetricsLog:
    def __init__(self, run_dir: Path, config: LoggingConfig, run_config: dict[str, Any]) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb: Any = None
        self._wandb: Any = None
        if config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ConfigError(
                    f"logging.tensorboard: needs the tensorboard package ({e})"
                ) from None
            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
        if config.wandb_project:
            try:
                import wandb
            except ImportError:
                raise ConfigError(
                    "logging.wandb_project: needs the wandb package (pip install wandb)"
                ) from None
            self._wandb = wandb.init(
                project=config.wandb_project,
                dir=str(run_dir),
                config=run_config,
                name=run_dir.name,
                resume="allow",
            )

    def log(self, record: dict[str, Any]) -> None:
        clean = {k: _finite(v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        step = int(record["step"])
        numbers = {k: v for k, v in clean.items() if isinstance(v, int | float) and k != "step"}
        if self._tb is not None:
            for key, value in numbers.items():
                if value is not None:
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a missing figure reads as null
    return value


class Progress:
    """One status line per event; redrawn in place on a terminal."""

    def __init__(self, total_steps: int, enabled: bool) -> None:
        self.total = total_steps
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self.first_step: int | None = None
        self.eval_accuracy: float | None = None
        """The latest eval's accuracy, shown on every line once an eval has ended."""

    def update(self, step: int, record: dict[str, Any], final: bool = False) -> None:
        if not self.enabled:
            return
        if self.first_step is None:
            self.first_step = step - 1
        done = step - self.first_step
        elapsed = time.monotonic() - self.started
        eta = elapsed / done * (self.total - step) if done > 0 else 0.0
        line = (
            f"step {step}/{self.total}  reward {record.get('rollout/reward_mean', 0.0):.3f}  "
            f"tok/s {_generation_rate(record):.0f}  "
            f"cap {int(record.get('concurrency/cap', 0))}  "
            + _placement(record)
            + (f"eval {self.eval_accuracy:.3f}  " if self.eval_accuracy is not None else "")
            + f"elapsed {_clock(elapsed)}  eta {_clock(eta)}"
        )
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _placement(record: dict[str, Any]) -> str:
    """Ranks and engines alive, once there is more than one of either."""
    ranks = int(record.get("cluster/trainer_ranks", 1))
    engines, active = (
        int(record.get("cluster/engines", 1)),
        int(record.get("cluster/engines_active", 1)),
    )
    if ranks <= 1 and engines <= 1:
        return ""
    return f"ranks {ranks}  engines {active}/{engines}  "


def _generation_rate(record: dict[str, Any]) -> float:
    """The engines' generation rate, else (before their first two metric polls) the rate at
    which this step's rollouts completed tokens."""
    rate = record.get("engine/generation_tokens_per_s")
    return float(rate if rate is not None else record.get("rollout/tokens_per_s", 0.0))


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def process_elapsed_s() -> float:
    """Seconds since this process started (Linux: from /proc; elsewhere since this import), so a
    time budget includes interpreter start-up and model loading."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - _IMPORTED_AT


_IMPORTED_AT = time.monotonic()


async def run_until(minutes: float | None) -> None:
    """Returns once `minutes` have passed since the process started (never when None): a run's
    `loop.max_minutes` budget, model loading included."""
    if minutes is None:
        await asyncio.Event().wait()
        return
    await asyncio.sleep(max(0.0, minutes * 60 - process_elapsed_s()))


def process_memory() -> dict[str, float]:
    """This process's resident memory, GiB: now (`memory/rss_gib`, from /proc; Linux only) and
    its peak so far (`memory/rss_peak_gib`, the kernel's). Where the embedded engine and the
    trainer run in the loop's process, both are in it."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out = {"memory/rss_peak_gib": peak / (2**30 if sys.platform == "darwin" else 2**20)}
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return out  # no /proc: the peak alone
    out["memory/rss_gib"] = pages * os.sysconf("SC_PAGE_SIZE") / 2**30
    return out


OPTIMIZER_GIB = "memory/optimizer_gib"


def optimizer_memory(trainer: Any) -> dict[str, float]:
    """The optimizer state (Adam's moments) this process holds, GiB (`memory/optimizer_gib`;
    what LoRA shrinks): the actor's and the critic's. A sharded (FSDP2) rank counts its own
    shard; the Ray trainer adds its ranks' figures. Nothing for a trainer whose optimizers
    live in other processes (the Ray trainer's driver side)."""
    import torch

    from tracerl.train.shard import local_nbytes

    optimizers = [getattr(trainer, f"{m}_optimizer", None) for m in ("actor", "critic")]
    if not any(optimizers):
        return {}
    held = 0
    for optimizer in filter(None, optimizers):
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    held += local_nbytes(value)
    return {OPTIMIZER_GIB: held / 2**30}


def release_free_memory() -> bool:
    """Give the pages the C allocator holds free back to the system (glibc's `malloc_trim`);
    False where the C library has none (musl, macOS). glibc keeps what a training step or the
    engine freed in its heaps, and a later allocation that does not fit those holes takes more:
    seven steps of a guess PPO run held 12-16.4 GiB between steps and peaked at 18.2 GB without
    this; 5.9 GiB and 13.4 GB with it around every step (docs/benchmarks.md)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)  # 1 if it gave pages back, 0 if none were free: either is success
    return True


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)
