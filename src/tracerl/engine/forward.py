"""A batched forward pass over a Hugging Face Llama-family model with a slot KV cache.

Owns the tensor work of the embedded engine and nothing else (no scheduling, no sampling). One
`forward` call decodes one new token for each of the first `n` slots and prefills any number of
new sequences (causal attention, K/V written into their slots) in the same pass.

The cache is one tensor per layer, `[slots, kv_heads, capacity, head_dim]`. Running sequences
occupy slots `0..n-1` (the scheduler compacts on release), so a decode step reads a plain view with
no gather, and a boolean mask hides each row's unused tail. Capacity grows by doubling up to the
context length, so memory follows the longest running sequence rather than the worst case.

The layers' own modules (projections, norms, MLP, rotary table) do the math, so numbers match the
model's reference forward to float tolerance. Supported: Llama, Mistral, Qwen2 and Qwen3 layouts
and their mixture-of-experts kin (Qwen2-MoE, Qwen3-MoE, Mixtral: the layer's `mlp` is the model's
own sparse block, routing every token of the step at once) with full attention (a sliding
window no shorter than the context is full attention); every other model runs on the generic
path (`tracerl.engine.generic`), which `make_runner` picks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tracerl.engine.adapters import adapters_for
from tracerl.models import sliding_window

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral")
# Starting per-slot capacity: large enough that short chats never reallocate.
INITIAL_CAPACITY = 256
# Slots allocated at first; more are added (doubling, up to `max_slots`) as sequences need them.
INITIAL_ROWS = 4


class UnsupportedModelError(ValueError):
    pass


def slot_path_fits(config: Any, max_model_len: int) -> str | None:
    """Why the slot-cache path cannot run this model exactly, or None when it can."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"it runs {', '.join(SUPPORTED_MODEL_TYPES)} layouts, not {config.model_type!r}"
    window = sliding_window(config)
    if window is not None and window < max_model_len:
        return f"it attends to the whole context, and the model slides a {window}-token window"
    return None


def make_runner(model: Any, max_slots: int, max_model_len: int, path: str = "auto") -> Any:
    """The runner of `engine.forward`: the slot-cache path where it runs the model exactly
    (`auto`, or `slots`, which refuses a model it cannot run), else the generic path."""
    from tracerl.engine.generic import GenericRunner

    unfit = slot_path_fits(model.config, max_model_len)
    if path == "generic" or (path == "auto" and unfit):
        return GenericRunner(model, max_slots)  # its caches are the model's own
    if unfit:
        raise UnsupportedModelError(
            f"engine.forward = 'slots': the slot-cache path cannot run this model ({unfit}); "
            "use engine.forward = 'auto' (the generic path) or 'generic'"
        )
    return ModelRunner(model, max_slots, max_model_len)


class ModelRunner:
    def __init__(self, model: Any, max_slots: int, max_model_len: int) -> None:
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"the embedded engine runs {', '.join(SUPPORTED_MODEL_TYPES)} models, not "
                f"{config.model_type!r}; serve it with vLLM or SGLang"
            )
        self.model = model
        self.body = model.model
        self.layers = list(model.model.layers)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.group = self.num_heads // self.num_kv_heads
        self.max_slots = max_slots
        self.max_model_len = max_model_len
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.capacity = min(INITIAL_CAPACITY, max_model_len)
        self.rows = min(INITIAL_ROWS, max_slots)
        """Slots allocated: the cache is `rows x capacity` tokens per layer, not `max_slots x
        capacity` (64 slots of a 1024-token SmolLM2 capacity would hold 2.8 GiB)."""
        self.k_cache = [self._empty(self.rows, self.capacity) for _ in self.layers]
        self.v_cache = [self._empty(self.rows, self.capacity) for _ in self.layers]
        with torch.inference_mode():
            positions = torch.arange(max_model_len, device=self.device)[None]  # [1, L]
            probe = torch.zeros(1, device=self.device, dtype=self.dtype)
            cos, sin = self.body.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0], sin[0]  # [L, head_dim]
        self._arange = torch.arange(max(max_model_len, max_slots), device=self.device)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]

    def _empty(self, rows: int, capacity: int) -> torch.Tensor:
        shape = (rows, self.num_kv_heads, capacity, self.head_dim)
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    @torch.inference_mode()
    def ensure_capacity(self, length: int, slots: int) -> None:
        """Make every slot hold at least `length` tokens, and slots `0..slots-1` exist (each
        grown by doubling; what the cache holds is copied)."""
        capacity, rows = self.capacity, self.rows
        while capacity < length:
            capacity *= 2
        while rows < slots:
            rows *= 2
        capacity, rows = min(capacity, self.max_model_len), min(rows, self.max_slots)
        if (capacity, rows) == (self.capacity, self.rows):
            return
        for cache in (self.k_cache, self.v_cache):
            for i, old in enumerate(cache):  # one layer at a time: a layer's copy is transient
                grown = self._empty(rows, capacity)
                grown[: self.rows, :, : self.capacity] = old
                cache[i] = grown
        self.capacity, self.rows = capacity, rows

    @torch.inference_mode()
    def shrink(self) -> None:
        """Release grown cache memory; only valid while no sequence is running."""
        initial = (min(INITIAL_CAPACITY, self.max_model_len), min(INITIAL_ROWS, self.max_slots))
        if (self.capacity, self.rows) != initial:
            self.capacity, self.rows = initial
            self.k_cache = [self._empty(self.rows, self.capacity) for _ in self.layers]
            self.v_cache = [self._empty(self.rows, self.capacity) for _ in self.layers]

    @torch.inference_mode()
    def move_slot(self, src: int, dst: int, length: int) -> None:
        for cache in (self.k_cache, self.v_cache):
            for layer_cache in cache:
                layer_cache[dst, :, :length] = layer_cache[src, :, :length]

    def _qkv(self, layer: Any, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        attn = layer.self_attn
        b, t, _ = h.shape
        q = attn.q_proj(h).view(b, t, self.num_heads, self.head_dim)
        k = attn.k_proj(h).view(b, t, self.num_kv_heads, self.head_dim)
        v = attn.v_proj(h).view(b, t, self.num_kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises per head before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, D]

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _mlp_residual(self, layer: Any, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = x + layer.self_attn.o_proj(attn_out)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    @torch.inference_mode()
    def save_prefix(self, slot: int, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """A copy of the first `length` cached positions of `slot`, every layer's K and V."""
        return (
            [cache[slot, :, :length].clone() for cache in self.k_cache],
            [cache[slot, :, :length].clone() for cache in self.v_cache],
        )

    @torch.inference_mode()
    def load_prefix(
        self, slot: int, saved: tuple[list[torch.Tensor], list[torch.Tensor]], length: int
    ) -> None:
        """Put the first `length` positions of a `save_prefix` copy into `slot`."""
        self.ensure_capacity(length, slot + 1)
        for cache, layers in zip((self.k_cache, self.v_cache), saved, strict=True):
            for layer_cache, layer in zip(cache, layers, strict=True):
                layer_cache[slot, :, :length] = layer[:, :length]

    @torch.inference_mode()
    def forward(
        self,
        decode_tokens: torch.Tensor,
        decode_positions: torch.Tensor,
        prefills: list[tuple[int, torch.Tensor, int]],
        adapters: list[str | None] | None = None,
    ) -> torch.Tensor:
        """One mixed step: a new token for each of slots `0..n-1`, and prefixes for `prefills`
        (`(slot, ids, start)`, slots `>= n`: `ids` follow the `start` positions the slot already
        holds, `load_prefix`'s). Returns logits `[n + len(prefills), V]`: the decode rows, then
        each prefix's last position. `adapters`: the LoRA adapter of each (decode rows, then
        prefills; None: the base), `tracerl.engine.adapters`.

        Projections and MLPs run once over all tokens (one large matmul beats a small decode
        matmul plus separate prefill matmuls on a CPU); only attention is split by sequence.
        """
        if adapters is None:
            return self._forward(decode_tokens, decode_positions, prefills)
        n = decode_tokens.shape[0]
        per_token = adapters  # one adapter for the whole step: no positions to tell apart
        if len(set(adapters)) > 1:
            per_token = adapters[:n] + [
                name for name, (_, ids, _) in zip(adapters[n:], prefills, strict=True)
                for _ in range(int(ids.shape[0]))
            ]  # fmt: skip
        with adapters_for(self.model, per_token):
            return self._forward(decode_tokens, decode_positions, prefills)

    def _forward(
        self,
        decode_tokens: torch.Tensor,
        decode_positions: torch.Tensor,
        prefills: list[tuple[int, torch.Tensor, int]],
    ) -> torch.Tensor:
        n = decode_tokens.shape[0]
        spans = [(start, start + int(ids.shape[0])) for _, ids, start in prefills]
        lengths = [e - s for s, e in spans]
        longest = max([int(decode_positions.max()) + 1 if n else 0, *(end for _, end in spans)])
        self.ensure_capacity(longest, max([n, *(slot + 1 for slot, _, _ in prefills)]))
        positions = torch.cat([decode_positions, *(self._arange[s:e] for s, e in spans)])
        tokens = torch.cat([decode_tokens, *(ids for _, ids, _ in prefills)])
        x = self.body.embed_tokens(tokens[None])  # [1, N, H]
        cos, sin = self.cos[positions], self.sin[positions]  # [N, D]
        if n:
            rows = self._arange[:n]
            decode_len = int(decode_positions.max()) + 1
            visible = self._arange[None, :decode_len] <= decode_positions[:, None]
            mask = visible[:, None, None, :]  # [n, 1, 1, L]
        # A prefix after cached positions sees all of them and itself causally.
        after_cache = [
            self._arange[None, :e] <= self._arange[s:e, None] if s else None for s, e in spans
        ]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(x))  # [1, heads, N, D]
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            parts = []
            if n:
                # Decode rows: write the new K/V, attend over each slot's cached prefix.
                self.k_cache[i][rows, :, decode_positions] = k[0, :, :n].transpose(0, 1)
                self.v_cache[i][rows, :, decode_positions] = v[0, :, :n].transpose(0, 1)
                keys = self.k_cache[i][:n, :, :decode_len]  # [n, kv_heads, L, D]
                values = self.v_cache[i][:n, :, :decode_len]
                # Query heads sharing a KV head act as that head's query positions: no KV copy.
                grouped = q[0, :, :n].transpose(0, 1).reshape(n, self.num_kv_heads, self.group, -1)
                out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask)
                parts.append(out.reshape(n, -1))  # [n, heads * D]
            offset = n
            for (slot, _, s), t, seen in zip(prefills, lengths, after_cache, strict=True):
                qs, ks, vs = (z[:, :, offset : offset + t] for z in (q, k, v))
                self.k_cache[i][slot, :, s : s + t] = ks[0]
                self.v_cache[i][slot, :, s : s + t] = vs[0]
                if seen is None:
                    out = F.scaled_dot_product_attention(
                        qs, ks, vs, is_causal=True, enable_gqa=True
                    )
                else:
                    keys = self.k_cache[i][slot : slot + 1, :, : s + t]
                    values = self.v_cache[i][slot : slot + 1, :, : s + t]
                    out = F.scaled_dot_product_attention(
                        qs, keys, values, attn_mask=seen, enable_gqa=True
                    )
                parts.append(out[0].transpose(0, 1).reshape(t, -1))  # [t, heads * D]
                offset += t
            attn = torch.cat(parts)[None] if len(parts) > 1 else parts[0][None]  # [1, N, heads*D]
            x = self._mlp_residual(layer, x, attn)
        ends = torch.tensor(lengths, dtype=torch.long, device=self.device).cumsum(0) + n - 1
        last = torch.cat([self._arange[:n], ends])
        return self.model.lm_head(self.body.norm(x[0, last])).float()  # [n + m, V]

    def prefill(self, slot: int, input_ids: torch.Tensor) -> torch.Tensor:
        """One sequence's full prefix into `slot`; the last position's logits `[V]`."""
        empty = torch.empty(0, dtype=torch.long, device=self.device)
        return self.forward(empty, empty, [(slot, input_ids, 0)])[0]

    def decode(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step for slots `0..n-1`: token `i` sits at `positions[i]`; logits `[n, V]`."""
        return self.forward(token_ids, positions, [])
