"""The token-level view of a session: each trajectory's tokens with their text, whether they
were sampled (`loss_mask` 1) or context, their log-probability, and the turn (and weight
version) each belongs to.

Owns: decoding token ids to text with the run's tokenizer (loaded once, on the first session
shown, so the run page and the episode list never wait for transformers), and cutting a
trajectory at its turn boundaries. Not: HTML (`tracerl.view.pages`).

Token text is each id decoded on its own, so a character split over several tokens shows as
its pieces; an id the tokenizer cannot decode (models pad the embedding past the vocabulary)
shows as "" and keeps its id, as the gateway does.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from tracerl.trace.schema import SessionTrace, Trajectory

log = logging.getLogger(__name__)


class TokenText:
    """Token id -> text with one model's tokenizer; ids without a tokenizer show as `⟨id⟩`."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        self.problem: str | None = None
        """Why token text is not available (shown on the page), or None."""
        self._tokenizer: Any = None
        self._loaded = False
        self._lock = threading.Lock()
        self._cache: dict[int, str] = {}

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self.model is None:
            self.problem = "config.json names no model: tokens show as ids"
            return
        try:
            from transformers import AutoTokenizer

            from tracerl.models import resolve_model

            self._tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.model))
        except Exception as e:  # any failure leaves ids readable, never the page broken
            log.warning("tokenizer of %s not loaded: %s", self.model, e)
            self.problem = f"the tokenizer of {self.model!r} could not be loaded ({e}): ids shown"

    def texts(self, ids: list[int]) -> list[str]:
        """The text of each of `ids` (blocking: call it off the event loop)."""
        with self._lock:
            self._load()
            unknown = sorted({i for i in ids if i not in self._cache})
            for i in unknown:
                self._cache[i] = self._decode(i)
            return [self._cache[i] for i in ids]

    def _decode(self, token_id: int) -> str:
        if self._tokenizer is None:
            return f"⟨{token_id}⟩"
        try:
            return str(self._tokenizer.decode([token_id]))
        except Exception:  # an id past the vocabulary
            return ""


@dataclass(frozen=True)
class TurnSpan:
    """One turn's tokens in a trajectory: positions [start, end)."""

    turn: int
    start: int
    end: int
    weight_version: int
    parent: int | None


@dataclass(frozen=True)
class TokenTrajectory:
    """A trajectory ready to draw."""

    index: int
    token_ids: list[int]
    texts: list[str]
    loss_mask: list[int]
    logprobs: list[float]
    spans: list[TurnSpan]
    fork_of: int | None
    """The turn this trajectory forks from (its prefix up to that turn is context), or None."""

    @property
    def sampled(self) -> int:
        return sum(self.loss_mask)


def turn_spans(trace: SessionTrace, trajectory: Trajectory) -> list[TurnSpan]:
    """Where each of the trajectory's turns ends: a turn's prompt extends everything before it,
    so its last token is at `len(prompt_ids) + len(completion_ids)`."""
    by_index = {t.index: t for t in trace.turns}
    spans, start = [], 0
    for index in trajectory.turn_indices:
        turn = by_index[index]
        end = len(turn.prompt_ids) + len(turn.completion_ids)
        spans.append(TurnSpan(index, start, end, turn.weight_version, turn.parent))
        start = end
    return spans


def token_view(trace: SessionTrace, text: TokenText) -> list[TokenTrajectory]:
    """Every trajectory of `trace`, with token text (blocking: the tokenizer may load)."""
    out = []
    for i, trajectory in enumerate(trace.trajectories):
        spans = turn_spans(trace, trajectory)
        first = spans[0] if spans else None
        out.append(
            TokenTrajectory(
                index=i,
                token_ids=trajectory.token_ids,
                texts=text.texts(trajectory.token_ids),
                loss_mask=trajectory.loss_mask,
                logprobs=trajectory.logprobs,
                spans=spans,
                fork_of=first.parent if first is not None else None,
            )
        )
    return out
