"""Constrained decoding for the embedded engine: `sampling_params.json_schema` (SGLang's field).

A request with a JSON schema may only sample tokens that keep its output a prefix of a JSON value
matching the schema, and ends when the value is complete. llguidance compiles the schema into a
grammar over the tokenizer's vocabulary and, before each sampled token, gives the mask of the
tokens that may follow; `sampling.sample` draws from the masked distribution.

Log-probabilities stay those of the unmasked, temperature-scaled distribution, as with top-p and
top-k truncation (see `sampling.py`): that is what the trainer recomputes from the same logits.
(vLLM applies its structured-output mask to the logits before it computes log-probs, so it
reports the masked distribution's; docs/engines.md says so.)

JSON is written compactly, with `json.dumps`' separators (", " and ": "): free whitespace would
let a weak model pad a value with whitespace until its budget runs out.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import torch

from tracerl.engine.types import RequestError

FIELD = "sampling_params.json_schema"

_JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class JsonConstraint:
    """One request's grammar state: the allowed next tokens, advanced token by token. Once the
    value is complete only an end-of-sequence token may follow, so the reply ends as the
    model's own replies do (the chat template's end-of-turn token sampled, not added)."""

    def __init__(self, matcher: Any, tokenizer_vocab: int, eos_ids: list[int]) -> None:
        self._matcher = matcher
        self._vocab = tokenizer_vocab
        self._eos = eos_ids
        self.complete = False
        """An end-of-sequence token was sampled after a complete value."""

    def allowed(self, embedding_size: int) -> torch.Tensor:
        """`[embedding_size]` bool: the tokens that may come next (ids past the tokenizer's
        vocabulary, which some models pad their embedding with, never may)."""
        out = torch.zeros(embedding_size, dtype=torch.bool)
        if self._matcher.is_stopped():  # complete: only its end may follow
            out[self._eos] = True
            return out
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self._vocab].astype(bool)
        size = min(self._vocab, embedding_size)
        out[:size] = torch.from_numpy(mask[:size])
        return out

    def advance(self, token: int) -> None:
        if token in self._eos:  # allowed only where the value may end
            self.complete = True
        elif not self._matcher.consume_token(token):
            raise RuntimeError(
                f"constrained decoding: token {token} was not allowed: {self._matcher.get_error()}"
            )
        elif not self._eos and self._matcher.is_stopped():
            self.complete = True  # a model without an end token ends with the value


class ConstraintCompiler:
    """Compiles JSON schemas against one tokenizer. The llguidance view of the vocabulary is
    built on first use (about a second for a 49k vocabulary), not at engine start, since most
    runs never constrain a request."""

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        self._hf = tokenizer
        self._eos = sorted(eos_ids)
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _llg(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                import llguidance.hf

                self._tokenizer = llguidance.hf.from_tokenizer(
                    self._hf, eos_token=self._eos or None
                )
            return self._tokenizer

    def compile(self, schema: str) -> JsonConstraint:
        """A fresh constraint for `schema` (a JSON string); `RequestError` naming the field when
        the schema is not one a grammar can be built from."""
        try:
            import llguidance
        except ImportError:
            raise RequestError(
                FIELD, "this engine has no grammar library: pip install llguidance"
            ) from None
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.loads(schema), overrides=_JSON_OPTIONS
            )
        except ValueError as e:
            raise RequestError(FIELD, f"not a JSON schema object: {e}") from None
        tokenizer = self._llg()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise RequestError(FIELD, error)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RequestError(FIELD, matcher.get_error())
        return JsonConstraint(matcher, int(tokenizer.vocab_size), self._eos)
