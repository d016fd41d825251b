"""A pooled request's progress across attempts: what the engine pool resumes from.

The tokens and log-probs sampled so far, the oldest and newest weight versions among them, and
their routed experts (a mixture-of-experts model's, `tracerl.routing`: each position keeps the
first attempt's row). From it the pool builds the next attempt (prompt + partial output as the
input, the remaining budget) and the caller's chunks (`tracerl.rollout.pool`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tracerl.engine.types import GenerateOutput, GenerateRequest
from tracerl.routing import fit, merge


@dataclass
class Progress:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    oldest: int | None = None
    """Weight version of its oldest token (None: no token yet)."""
    newest: int = 0
    """Weight version of its newest token."""
    routing: np.ndarray | None = None
    """Routed experts of its positions so far, from every attempt."""

    def add(self, chunk: GenerateOutput) -> None:
        """Take an attempt's chunk: its tokens, their weights' versions, and its routing (an
        aborted attempt's covers the positions it computed, a resumed one's the rest; the
        chunk keeps none: the caller gets one record, on the last chunk, `routing_for`)."""
        self.ids += chunk.output_ids
        self.logprobs += chunk.output_logprobs
        self.routing = merge(self.routing, chunk.routed_experts)
        chunk.routed_experts = None
        if chunk.output_ids:
            self.newest = chunk.weight_version
            oldest = chunk.weight_version
            if chunk.weight_version_min is not None:  # the engine's own word
                oldest = min(oldest, chunk.weight_version_min)
            if self.oldest is None or oldest < self.oldest:
                self.oldest = oldest

    def routing_for(self, request: GenerateRequest) -> np.ndarray | None:
        """The routing of `request`'s prompt and every token so far, a row per token."""
        if self.routing is None:
            return None
        return fit(self.routing, len(request.input_ids) + len(self.ids))

    def attempt(
        self, request: GenerateRequest, attempt: int, remaining: int | None
    ) -> GenerateRequest:
        """Attempt number `attempt` of `request`: itself at first, else resumed from the tokens
        so far with the `remaining` budget. A JSON schema is dropped once part of its value is
        sampled (no engine API starts a grammar part-way through a value: the rest is sampled
        unconstrained, the model seeing the partial value it continues)."""
        if attempt == 1 and not self.ids:
            return request
        update: dict[str, object] = {"max_new_tokens": remaining}
        if self.ids and request.sampling_params.json_schema is not None:
            update["json_schema"] = None
        params = request.sampling_params.model_copy(update=update)
        return request.model_copy(
            update={
                "rid": f"{request.rid}-a{attempt}",
                "input_ids": request.input_ids + self.ids,
                "sampling_params": params,
            }
        )

    def final(self, request: GenerateRequest, finish: str) -> GenerateOutput:
        """A last chunk with no new tokens (the budget was spent by earlier attempts)."""
        return GenerateOutput(
            rid=request.rid,
            output_ids=[],
            output_logprobs=[],
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(self.ids),
            weight_version=self.newest,
            finish_reason=finish,  # type: ignore[arg-type]
            adapter=request.lora_path,
            routed_experts=self.routing_for(request),
        )
