"""Routed experts: which experts a mixture-of-experts model's routers chose for each token.

An array `[T, L, k]` per sequence: row `p` holds, for the token at position `p` (as the model's
input), the `k` experts each of its `L` MoE layers routed it to (logical expert ids, the
layers in model order; dense layers of a partly sparse model have no row). Its dtype is the
smallest that holds the expert count plus one value: uint8 up to 255 experts, uint16 above.
The dtype's largest value (`missing`) marks a position whose routing was not recorded, as the
last token of a sequence (sampled, never fed to the model), so every array of a sequence is
exactly as long as its tokens and aligns with them row for row.

The engine records what its routers chose (`RoutingCapture`), the pool keeps the routing of
the first attempt that computed each position across aborts and resumes (`merge`), the gateway
records it in the turn (`RoutedExperts`, base64 in JSON), trajectories assemble it beside their
token ids, and the trainer can replay it (`tracerl.train.replay`).

Routers are found by their form, which transformers' MoE families share: a module whose class
name ends in `TopKRouter`, with `top_k` and `num_experts`, whose forward returns
`(router_logits, scores, indices)` (Qwen2/Qwen3-MoE, Mixtral, OLMoE and others).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

DTYPES = ("uint8", "uint16")


def routers(model: Any) -> list[Any]:
    """The model's MoE routers, in layer order (empty for a dense model)."""
    return [
        m
        for m in model.modules()
        if type(m).__name__.endswith("TopKRouter")
        and hasattr(m, "top_k")
        and hasattr(m, "num_experts")
    ]


def routing_dtype(num_experts: int) -> np.dtype[Any]:
    """The compact dtype for `num_experts` (one value kept for `missing`)."""
    if num_experts < 255:
        return np.dtype(np.uint8)
    if num_experts < 65535:
        return np.dtype(np.uint16)
    raise ValueError(f"num_experts: {num_experts} experts do not fit a uint16 routing record")


def missing(dtype: np.dtype[Any] | str) -> int:
    """The value marking an unrecorded position in arrays of `dtype`."""
    return int(np.iinfo(np.dtype(dtype)).max)


def blank(rows: int, layers: int, top_k: int, dtype: np.dtype[Any] | str) -> np.ndarray:
    """`rows` unrecorded positions."""
    return np.full((rows, layers, top_k), missing(dtype), dtype=np.dtype(dtype))


def unrecorded(routing: np.ndarray) -> np.ndarray:
    """Which rows of `routing` hold no record, `[T]` bool."""
    return (routing == missing(routing.dtype)).all(axis=(1, 2))


def fit(routing: np.ndarray, rows: int) -> np.ndarray:
    """`routing` cut or padded (with unrecorded rows) to exactly `rows` positions."""
    if routing.shape[0] >= rows:
        return routing[:rows]
    pad = blank(rows - routing.shape[0], routing.shape[1], routing.shape[2], routing.dtype)
    return np.concatenate([routing, pad])


def merge(earlier: np.ndarray | None, later: np.ndarray | None) -> np.ndarray | None:
    """One record of a sequence from two that computed overlapping positions: each position
    keeps the earlier record's routing where it has one (what sampled the tokens after it),
    else the later's. The result is as long as the longer."""
    if earlier is None or later is None:
        return later if earlier is None else earlier
    if earlier.shape[1:] != later.shape[1:] or earlier.dtype != later.dtype:
        raise ValueError(
            f"routed experts of shapes {earlier.shape} ({earlier.dtype}) and {later.shape} "
            f"({later.dtype}) describe different models"
        )
    rows = max(earlier.shape[0], later.shape[0])
    out = fit(later, rows).copy()
    head = fit(earlier, rows)
    known = ~unrecorded(head)
    out[known] = head[known]
    return out


def moe_layout(model: str) -> tuple[int, int, int] | None:
    """`(layers, top_k, experts)` of a model directory's config (`config.json`) when it is a
    mixture of experts, else None: the built-in models are dense, and a GGUF file is not read
    (no engine server is asked for routing then). `layers` is `num_hidden_layers`, as SGLang
    counts them."""
    config_file = Path(model).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    config = config.get("text_config", config)
    top_k = config.get("num_experts_per_tok")
    experts = config.get("num_experts") or config.get("num_local_experts")
    if not top_k or not experts:
        return None
    return int(config["num_hidden_layers"]), int(top_k), int(experts)


def from_sglang(data: str, layout: tuple[int, int, int], tokens: int) -> np.ndarray:
    """SGLang's `meta_info.routed_experts` (base64 of raw int32 `[rows, layers, top_k]`, a row
    per fed position) as a record of `tokens` rows; `ValueError` naming what does not fit."""
    layers, top_k, experts = layout
    raw = np.frombuffer(base64.b64decode(data, validate=True), dtype=np.int32)
    if raw.size % (layers * top_k):
        raise ValueError(f"{raw.size} expert ids are not rows of {layers} layers x top-{top_k}")
    rows = raw.reshape(-1, layers, top_k)
    if rows.shape[0] >= tokens:
        raise ValueError(f"{rows.shape[0]} rows for {tokens} tokens (at most {tokens - 1})")
    if rows.size and (rows.min() < 0 or rows.max() >= experts):
        raise ValueError(f"expert ids outside [0, {experts})")
    return fit(rows.astype(routing_dtype(experts)), tokens)


class RoutedExperts(BaseModel):
    """A routing array in JSON: `shape` `[T, L, k]`, `dtype`, the raw bytes in base64."""

    model_config = ConfigDict(extra="forbid")

    dtype: str
    shape: list[int] = Field(min_length=3, max_length=3)
    data: str

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        if v not in DTYPES:
            raise ValueError(f"expected one of {', '.join(DTYPES)}, got {v!r}")
        return v

    @classmethod
    def of(cls, routing: np.ndarray) -> RoutedExperts:
        return cls.model_construct(
            dtype=str(routing.dtype),
            shape=list(routing.shape),
            data=base64.b64encode(np.ascontiguousarray(routing).tobytes()).decode("ascii"),
        )

    def array(self) -> np.ndarray:
        raw = base64.b64decode(self.data, validate=True)
        dtype = np.dtype(self.dtype)
        expected = int(np.prod(self.shape)) * dtype.itemsize
        if len(raw) != expected:
            raise ValueError(
                f"{len(raw)} bytes, but shape {self.shape} of {self.dtype} needs {expected}"
            )
        return np.frombuffer(raw, dtype=dtype).reshape(self.shape).copy()


class RoutingCapture:
    """Records what a model's routers choose, one forward at a time.

    `layout` is `(layers, top_k, dtype)`; a dense model has no routers and `capture()` then
    installs nothing (`enabled` False): the feature costs it nothing. Within `capture()`, each
    router's chosen indices are kept (as `[tokens, k]`, each forward's tokens flattened in
    order, several forwards one after the other); `take()` returns them stacked `[tokens, L,
    k]` in the compact dtype, on the CPU, and clears them. Every router must have seen the same
    tokens (a model that loops a layer, or skips one, is refused there)."""

    def __init__(self, model: Any) -> None:
        self.routers = routers(model)
        self.enabled = bool(self.routers)
        self.layout: tuple[int, int, np.dtype[Any]] | None = None
        if self.enabled:
            top_k = {int(r.top_k) for r in self.routers}
            experts = {int(r.num_experts) for r in self.routers}
            if len(top_k) != 1 or len(experts) != 1:
                raise ValueError(
                    f"routed experts: the model's routers differ in top_k {sorted(top_k)} or "
                    f"expert count {sorted(experts)}; one record shape cannot hold them"
                )
            self.layout = (len(self.routers), top_k.pop(), routing_dtype(experts.pop()))
        self._seen: list[list[torch.Tensor]] = [[] for _ in self.routers]

    @contextmanager
    def capture(self) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self._seen = [[] for _ in self.routers]

        def hook_for(layer: int) -> Any:
            def hook(module: Any, args: Any, output: Any) -> None:
                self._seen[layer].append(output[2].detach())

            return hook

        # registered for this forward only (not once at start): registered last, they read
        # the router's final output whatever other hooks changed it before them
        handles = [r.register_forward_hook(hook_for(i)) for i, r in enumerate(self.routers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def take(self) -> np.ndarray:
        """This forward's routing `[tokens, L, k]` (the routers' tokens, in order)."""
        assert self.layout is not None
        per_layer = [torch.cat(seen) if seen else None for seen in self._seen]
        self._seen = [[] for _ in self.routers]
        counts = {-1 if p is None else int(p.shape[0]) for p in per_layer}
        if len(counts) != 1 or -1 in counts:
            raise RuntimeError(
                f"routed experts: the routers saw different token counts {sorted(counts)}"
            )
        stacked = torch.stack([p for p in per_layer if p is not None], dim=1)
        return stacked.to("cpu", torch.int32).numpy().astype(self.layout[2])
