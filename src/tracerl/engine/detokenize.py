"""Decoding token ids to text without ever failing on ids the tokenizer does not know.

Models pad their embedding past the tokenizer's vocabulary, so an engine can sample ids that have
no text. Those decode to "" and keep their id (the seed's vLLM crash came from exactly this).
"""

from __future__ import annotations

from typing import Any

REPLACEMENT_CHAR = "\ufffd"


def safe_decode(tokenizer: Any, ids: list[int], skip_special_tokens: bool = False) -> str:
    """Decode `ids`, dropping ids outside the tokenizer's vocabulary."""
    known = [i for i in ids if 0 <= i < len(tokenizer)]
    if not known:
        return ""
    return str(tokenizer.decode(known, skip_special_tokens=skip_special_tokens))


class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas for streaming.

    It re-decodes only a short window (from a few tokens before the last emitted text), and holds
    back text that ends in an incomplete UTF-8 sequence until the next token completes it.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _window(self) -> tuple[str, str]:
        """The text already emitted from the window, and the window's whole text."""
        prefix = safe_decode(
            self.tokenizer, self.ids[self.prefix_offset : self.read_offset], self.skip
        )
        return prefix, safe_decode(self.tokenizer, self.ids[self.prefix_offset :], self.skip)

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        prefix, full = self._window()
        if full.endswith(REPLACEMENT_CHAR) or len(full) <= len(prefix):
            return ""
        delta = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return delta

    def flush(self) -> str:
        """Whatever is held back (at the end of a stream), even if it is an incomplete character."""
        prefix, full = self._window()
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""
