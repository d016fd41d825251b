"""Configuration of the adaptive concurrency controller and the episode dispatcher."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from tracerl.config.base import Config


class ConcurrencyConfig(Config):
    initial_inflight: int | None = Field(default=None, ge=1)
    """Starting cap; unset bootstraps once from the engines' KV capacity / max model length."""
    min_inflight: int = Field(default=1, ge=1)
    """Hard floor of the cap (min = max pins it: fixed concurrency)."""
    max_inflight: int | None = Field(default=1024, ge=1)
    """Hard ceiling of the cap; unset (`None`): no ceiling, the engines' measured capacity
    alone bounds it."""
    frozen_steps: int = Field(default=1, ge=0)
    """The cap is pinned for the first k step boundaries (HARD cuts still apply)."""
    poll_interval_s: float = Field(default=5.0, gt=0)
    """How often the collector polls every engine's /metrics."""
    poll_timeout_s: float = Field(default=3.0, gt=0)
    """A poll slower than this is skipped (not fatal)."""

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        ceiling = self.max_inflight
        if ceiling is not None and self.min_inflight > ceiling:
            raise ValueError(f"min_inflight ({self.min_inflight}) exceeds max_inflight ({ceiling})")
        initial = self.initial_inflight
        if initial is not None and not (
            self.min_inflight <= initial and (ceiling is None or initial <= ceiling)
        ):
            raise ValueError(
                f"initial_inflight ({self.initial_inflight}) is outside "
                f"[min_inflight, max_inflight]"
            )
        return self


class OrchestratorConfig(Config):
    batch_size: int = Field(default=64, ge=1)
    """Trajectories per training step."""
    group_size: int = Field(default=8, ge=1)
    """Samples per prompt (a group); batch_size must be a multiple of it."""
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)

    @model_validator(mode="after")
    def _groups(self) -> Self:
        if self.batch_size % self.group_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) is not a multiple of group_size "
                f"({self.group_size})"
            )
        return self
