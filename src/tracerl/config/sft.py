"""Configuration of `tracerl sft CONFIG.toml`: supervised fine-tuning on conversations or on a
run's recorded traces, with the trainer's machinery. No torch here."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from tracerl.config.base import Config
from tracerl.config.run import LoggingConfig
from tracerl.config.train import TrainerConfig


class SftDataConfig(Config):
    """What SFT trains on: `messages` (a conversation dataset) or `traces` (runs' episodes)."""

    source: Literal["messages", "traces"] = "messages"
    """`messages`: JSONL or Parquet rows with OpenAI-format `messages` (and optional `tools`),
    rendered with the model's chat template and chat format, loss on assistant tokens only.
    `traces`: the episodes of `runs`, their recorded token ids and loss masks exactly."""
    path: str | None = None
    """`messages`: the dataset file (`.jsonl` or `.parquet`)."""
    runs: list[str] = Field(default_factory=list)
    """`traces`: run directories (each with `episodes.jsonl` and `traces.sqlite`)."""
    kind: str | None = "train"
    """`traces`: only episodes of this kind (`train`, `eval`, `demo`); unset: any."""
    env: str | None = None
    """`traces`: only episodes of this environment; unset: any."""
    reward_min: float | None = None
    """`traces`: only episodes whose reward is at least this (rejection sampling)."""
    reward_max: float | None = None
    """`traces`: only episodes whose reward is at most this."""
    max_tokens: int | None = Field(default=None, ge=2)
    """Leave out samples longer than this many tokens (counted; unset: keep all)."""

    @model_validator(mode="after")
    def _source_fields(self) -> Self:
        if self.source == "messages" and not self.path:
            raise ValueError('data.path: required with data.source = "messages"')
        if self.source == "traces" and not self.runs:
            raise ValueError('data.runs: required with data.source = "traces"')
        return self


class SftConfig(Config):
    steps: int | None = Field(default=None, ge=1)
    """Optimizer steps to run; unset: `epochs` passes over the data."""
    epochs: float = Field(default=1.0, gt=0)
    """Passes over the data when `steps` is unset (the step count is rounded up)."""
    batch_size: int = Field(default=16, ge=1)
    """Samples per step; their loss is the mean over every trained token of the step."""
    checkpoint_every: int = Field(default=10, ge=1)
    """Save a checkpoint every this many steps (and at the end, and on Ctrl-C)."""
    export: bool = True
    """At the end, write the model as a Hugging Face directory at RUN_DIR/export."""


class SftCommandConfig(Config):
    """`tracerl sft`: samples -> shuffled batches -> the trainer's token-budget micro-batches ->
    negative log-likelihood of the trained tokens, with checkpoints that resume exactly."""

    trainer: TrainerConfig = Field(default_factory=lambda: TrainerConfig(algorithm="grpo"))
    """The model, optimizer (`trainer.actor`), precision, token budget and seed. The RL fields
    (algorithm, clipping, KL, critic) do not apply."""
    data: SftDataConfig
    sft: SftConfig = Field(default_factory=SftConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="before")
    @classmethod
    def _no_critic(cls, data: Any) -> Any:
        """`trainer.algorithm` defaults to one without a critic (no critic is built)."""
        if isinstance(data, dict) and isinstance(data.get("trainer"), dict):
            data = {**data, "trainer": {"algorithm": "grpo", **data["trainer"]}}
        return data

    @model_validator(mode="after")
    def _actor_only(self) -> Self:
        t = self.trainer
        if t.algorithm == "ppo" or t.kl_loss_coef > 0 or t.kl_reward_coef > 0:
            raise ValueError(
                "trainer.algorithm, trainer.kl_loss_coef, trainer.kl_reward_coef: SFT trains "
                'the actor alone; leave algorithm "grpo" (its default here) and the KL '
                "coefficients 0"
            )
        return self
