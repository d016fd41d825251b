"""Configuration of the engine pool: health checking, retries and weight sync."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tracerl.config.base import Config


class PoolConfig(Config):
    health_interval_s: float = Field(default=2.0, gt=0)
    """How often every engine's `/health` is polled."""
    health_timeout_s: float = Field(default=5.0, gt=0)
    """A health poll that takes longer counts as a failure."""
    failure_threshold: int = Field(default=3, ge=1)
    """Consecutive failures (polls or requests) that take an engine out of rotation."""
    request_timeout_s: float = Field(default=300.0, gt=0)
    """Longest wait for an engine's next reply chunk before the attempt fails over."""
    max_attempts: int = Field(default=4, ge=1)
    """Attempts per request, the first included; each retry resumes from the tokens so far."""
    no_engine_wait_s: float = Field(default=60.0, ge=0)
    """How long a request waits for an engine to become active before failing; while a
    launched engine is restarting, requests wait for it instead (up to its start-up timeout,
    `engine.ready_timeout_s`: a vLLM server takes about a minute to start)."""
    update_mode: Literal["in_place", "abort_resume", "wait"] = "in_place"
    """Weight sync: pause in-flight requests in place and continue them on the new weights over
    the KV the old ones wrote (nothing is recomputed; every token is labelled with the weights
    that sampled it, and its log-prob is the one it was sampled with); abort them and resume
    them on the new weights (their prompt and partial output prefilled again); or wait for them
    to finish first. in_place measured 649 steps/hour against abort_resume's 473 in the async
    loop on SmolLM2 (`tracerl bench loop --engine embedded`)."""
    update_timeout_s: float = Field(default=600.0, gt=0)
    """A weight sync that takes longer fails (admission reopens; nothing hangs forever)."""
    weight_probe: bool = True
    """In `tracerl train`, after the engines start and after every weight push, check that
    each engine's log-probs of a fixed probe equal the trainer's (`tracerl.run.probe`): an
    engine that did not get the weights whole stops the run with an error naming it and the
    layers that explain the difference."""
    weight_probe_tolerance: float | None = Field(default=None, gt=0)
    """Largest log-prob difference the probe accepts; unset: by the coarser of the engine's
    and the trainer's dtypes (float32 2e-4, float16 0.15, bfloat16 1.5)."""
