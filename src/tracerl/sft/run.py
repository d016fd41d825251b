"""`tracerl sft CONFIG.toml`: supervised fine-tuning with the RL trainer's machinery.

The samples (`tracerl.sft.data`) are loaded once and fixed; the order of each pass is a
permutation drawn from (`trainer.seed`, pass), so step k trains on positions
`[k * batch_size, (k + 1) * batch_size)` of the concatenated passes whatever happened before.
A step is `Trainer.sft_step`: the step's samples cut into the trainer's token-budget
micro-batches, their loss the mean negative log-likelihood of every trained token, one AdamW
update with the trainer's clipping and schedule. Checkpoints are the trainer's (model,
optimizer, schedule, random state) and are written before the step's metrics line; a run
killed at any point resumes (`--resume`) from its newest checkpoint and trains the same steps on
the same samples as an uninterrupted run. At the end the model is exported (RUN_DIR/export) for
`tracerl train --trainer.model=RUN_DIR/export`; `tracerl export` reads any checkpoint too.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tracerl.config import ConfigError
from tracerl.config.sft import SftCommandConfig
from tracerl.run.metrics import MetricsLog, truncate_metrics
from tracerl.sft.data import SftDataError, messages_samples, traces_samples
from tracerl.train.batch import TrainSample

if TYPE_CHECKING:
    from tracerl.train.trainer import Trainer

DATA_FILE = "sft_data.json"
"""What the run trained on: sample count and tokens, written when it starts (for a resume to
check that the data did not change)."""


@dataclass(frozen=True)
class SftPlan:
    """The samples and the steps over them."""

    samples: list[TrainSample]
    steps: int
    batch_size: int
    seed: int

    def batch(self, step: int) -> list[TrainSample]:
        """The samples of step `step` (0-based)."""
        n = len(self.samples)
        orders: dict[int, list[int]] = {}
        out = []
        for position in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, at = divmod(position, n)
            if epoch not in orders:
                orders[epoch] = self._order(epoch)
            out.append(self.samples[orders[epoch][at]])
        return out

    def _order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.samples), generator=generator).tolist()

    def fingerprint(self) -> dict[str, int]:
        return {
            "samples": len(self.samples),
            "tokens": sum(len(s.token_ids) for s in self.samples),
            "trained_tokens": sum(sum(s.loss_mask) for s in self.samples),
        }


def load_samples(config: SftCommandConfig, tokenizer: Any) -> tuple[list[TrainSample], int]:
    """The configured data as samples, and how many were left out for `data.max_tokens`."""
    from tracerl.gateway.render import ChatRenderer
    from tracerl.models import model_eos_ids, resolve_model

    data = config.data
    if data.source == "messages":
        assert data.path is not None
        try:
            renderer = ChatRenderer(tokenizer, config.trainer.chat_format)
        except ValueError as e:
            raise SftDataError(f"trainer.chat_template: {e}") from None
        eos = model_eos_ids(resolve_model(config.trainer.model), tokenizer)
        ends = renderer.turn_ends(eos | set(renderer.stop_ids()))
        samples = messages_samples(Path(data.path), renderer, ends)
    else:
        samples = traces_samples(data, len(tokenizer))
    kept = [s for s in samples if data.max_tokens is None or len(s.token_ids) <= data.max_tokens]
    if not kept:
        raise SftDataError(f"data.max_tokens: every sample is longer than {data.max_tokens}")
    return kept, len(samples) - len(kept)


def plan(config: SftCommandConfig, samples: list[TrainSample]) -> SftPlan:
    s = config.sft
    steps = s.steps or math.ceil(s.epochs * len(samples) / s.batch_size)
    return SftPlan(samples, steps, s.batch_size, config.trainer.seed)


def run_sft(config: SftCommandConfig, run_dir: Path, resume: bool = False) -> int:
    """Train, checkpoint, export; returns the exit status."""
    from tracerl.models import load_tokenizer, resolve_model
    from tracerl.train.checkpoint import CheckpointError
    from tracerl.train.trainer import Trainer

    started = time.monotonic()
    tokenizer = load_tokenizer(resolve_model(config.trainer.model), config.trainer.chat_template)
    try:
        samples, dropped = load_samples(config, tokenizer)
    except SftDataError as e:
        raise ConfigError(str(e)) from None
    sft = plan(config, samples)
    _check_data(run_dir / DATA_FILE, sft.fingerprint(), resume)
    trainer_config = config.trainer.model_copy(update={"total_steps": sft.steps})
    trainer = Trainer(trainer_config)
    if resume:
        try:
            trainer.load_checkpoint(run_dir / "checkpoints")
        except CheckpointError as e:
            raise ConfigError(f"--resume: {e}") from None
    # steps after the checkpoint run again (a cold start restarted before its first checkpoint
    # starts over): their earlier lines go
    truncate_metrics(run_dir / "metrics.jsonl", trainer.step_count)
    metrics = MetricsLog(run_dir, config.logging, config.model_dump(mode="json"))
    print(
        f"tracerl sft: {len(samples)} samples ({dropped} longer than data.max_tokens left "
        f"out), {sft.steps} steps of {sft.batch_size}, run dir {run_dir}"
        + (f", resumed at step {trainer.step_count}" if trainer.step_count else ""),
        flush=True,
    )
    try:
        _train(trainer, sft, run_dir, config, metrics, started)
    except KeyboardInterrupt:
        trainer.save_checkpoint(run_dir / "checkpoints", {"step": trainer.step_count})
        print(f"tracerl sft: stopped at step {trainer.step_count}, checkpointed", flush=True)
        return 130
    finally:
        metrics.close()
    if config.sft.export:
        print(f"tracerl sft: exported {trainer.export(run_dir / 'export')}", flush=True)
    return 0


def _train(
    trainer: Trainer,
    sft: SftPlan,
    run_dir: Path,
    config: SftCommandConfig,
    metrics: MetricsLog,
    started: float,
) -> None:
    every = config.sft.checkpoint_every
    while trainer.step_count < sft.steps:
        record = trainer.sft_step(sft.batch(trainer.step_count))
        step = trainer.step_count
        if step % every == 0 or step == sft.steps:
            trainer.save_checkpoint(run_dir / "checkpoints", {"step": step})
        record["step"] = step
        record["time/elapsed_s"] = time.monotonic() - started
        metrics.log(record)
        if config.logging.progress:
            print(
                f"step {step}/{sft.steps}  loss {record['actor/sft_loss']:.4f}  "
                f"tokens {int(record['perf/trained_tokens'])}  "
                f"{record['time/step']:.1f}s",
                flush=True,
            )


def _check_data(path: Path, fingerprint: dict[str, int], resume: bool) -> None:
    """A resumed run must train on the data it started with."""
    if resume and path.exists():
        before = json.loads(path.read_text())
        if before != fingerprint:
            raise ConfigError(
                f"--resume: the data changed since the run started (it had {before}, now "
                f"{fingerprint}); a resume trains on the same samples"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fingerprint) + "\n")
