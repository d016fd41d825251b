"""The embedded engine's generic path: any causal LM transformers can run, through the model's
own forward and its own cache, one sequence at a time.

`ModelRunner` (`tracerl.engine.forward`) is the fast path: one batched pass over every running
sequence with a slot KV cache, for the layouts it knows (Llama, Mistral, Qwen2/3) with full
attention. Everything else runs here, correct rather than fast: Gemma 2/3 (sliding and global
layers, soft-capped logits, scaled embeddings), Qwen3-MoE, Phi-3, OLMo 2, Granite, and any model
with a sliding window. Each slot holds the sequence's own cache (`DynamicCache` built from the
model's config, so a sliding layer keeps only its window), prefills run the model on the whole
prefix and each decode step runs it on one token, so attention, windows and positions are the
model's own, exactly what the trainer's forward computes. The cost is one forward per running
sequence per step (`tracerl bench engine` measures it against the slot cache).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from tracerl.engine.adapters import adapters_for


class GenericRunner:
    """The `ModelRunner` interface over the model's own forward (see the module docstring)."""

    def __init__(self, model: Any, max_slots: int) -> None:
        self.model = model
        self.max_slots = max_slots
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.caches: list[Any] = [None] * max_slots
        self.lengths = [0] * max_slots
        # transformers renamed the forward's `past_key_values` (and the output's field) `cache`
        # during 5.x; tracerl allows either side of it (vLLM's CPU build pins transformers<5.20).
        renamed = "cache" in inspect.signature(model.forward).parameters
        self._cache_name = "cache" if renamed else "past_key_values"

    def _run(self, slot: int, ids: torch.Tensor) -> torch.Tensor:
        """`ids` after what slot `slot` holds; the last position's logits `[V]`."""
        cache = {self._cache_name: self.caches[slot]}
        out = self.model(input_ids=ids[None], **cache, use_cache=True, logits_to_keep=1)
        self.caches[slot] = getattr(out, self._cache_name)
        self.lengths[slot] += int(ids.shape[0])
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def forward(
        self,
        decode_tokens: torch.Tensor,
        decode_positions: torch.Tensor,
        prefills: list[tuple[int, torch.Tensor, int]],
        adapters: list[str | None] | None = None,
    ) -> torch.Tensor:
        """As `ModelRunner.forward`: a new token for slots `0..n-1` (at `decode_positions`),
        and whole prefixes for `prefills` (no prefix cache here: every `start` is 0); logits
        `[n + len(prefills), V]`; `adapters`: each one's LoRA adapter (None: the base)."""
        from transformers import DynamicCache

        n = decode_tokens.shape[0]
        names = adapters if adapters is not None else [None] * (n + len(prefills))
        rows = []
        for slot, (token, position) in enumerate(zip(decode_tokens, decode_positions, strict=True)):
            if self.lengths[slot] != int(position):
                raise RuntimeError(
                    f"slot {slot} holds {self.lengths[slot]} tokens, decode at {int(position)}"
                )
            with adapters_for(self.model, [names[slot]]):
                rows.append(self._run(slot, token[None]))
        for j, (slot, ids, start) in enumerate(prefills):
            if start:
                raise RuntimeError("the generic path keeps no prefix cache: a prefill starts at 0")
            self.caches[slot] = DynamicCache(config=self.model.config)
            self.lengths[slot] = 0
            with adapters_for(self.model, [names[n + j]]):
                rows.append(self._run(slot, ids))
        return torch.stack(rows)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        self.caches[dst], self.lengths[dst] = self.caches[src], self.lengths[src]
        self.caches[src], self.lengths[src] = None, 0

    def shrink(self) -> None:
        """Release every cache; only valid while no sequence is running."""
        self.caches = [None] * self.max_slots
        self.lengths = [0] * self.max_slots
