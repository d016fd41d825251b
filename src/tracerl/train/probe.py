"""The trainer's side of the weight probe (`tracerl.run.probe`): the actor's log-probs of one
token sequence, and, when an engine's differ, which layers explain the difference.

The log-probs follow `tracerl.train.forward` (the engine's definition: `log_softmax(logits / T)`
at each token, T = 0 reported at T = 1), so a probe compares exactly what a training step
compares. The diagnosis asks, layer by layer, whether the engine's log-probs are what the
trainer's model gives with that one layer put back to its initial weights (the model directory
the run started from): an engine whose loader skipped a layer keeps that layer's initial
weights, which is how vLLM's reload left a tied output layer. `torch.func.functional_call` with
`tie_weights=False` puts back an output layer apart from the embedding it is tied to.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

BLOCKS = ("layers", "h", "blocks")
"""Module lists whose numbered children are decoder blocks (Llama-style, GPT-2-style, ...)."""
SUSPECT_SHARE = 0.5
"""A layer is a suspect when putting it back closes at least this share of the difference."""


@torch.no_grad()
def sequence_logprobs(
    model: Any,
    token_ids: Sequence[int],
    prompt_len: int,
    temperature: float,
    params: dict[str, torch.Tensor] | None = None,
) -> list[float]:
    """Log-probs of `token_ids[prompt_len:]`, each given the tokens before it; `params`
    replaces those parameters (by name) for this forward only."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(token_ids)], device=device)
    kwargs = {"input_ids": ids, "use_cache": False}
    if params:
        from torch.func import functional_call

        out = functional_call(model, params, (), kwargs, tie_weights=False, strict=False)
    else:
        out = model(**kwargs)
    logits = out.logits[0, prompt_len - 1 : -1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    chosen = logits.gather(-1, ids[0, prompt_len:, None])[:, 0]
    return (chosen - torch.logsumexp(logits, dim=-1)).tolist()


def layer_groups(model: Any) -> dict[str, list[str]]:
    """Parameter names by layer: each decoder block (`...layers.N`), and every other module
    holding parameters (the embedding, the final norm, the output layer); a tied output layer
    is a layer of its own."""
    groups: dict[str, list[str]] = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        parts = name.split(".")
        blocks = (i + 2 for i, p in enumerate(parts[:-2]) if p in BLOCKS and parts[i + 1].isdigit())
        layer = next(blocks, len(parts) - 1)
        groups.setdefault(".".join(parts[:layer]), []).append(name)
    return groups


def tied_names(model: Any) -> dict[str, str]:
    """Output-layer parameter name -> the embedding parameter it is tied to (empty if untied)."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or head.weight is not embedding.weight:
        return {}
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    return {f"{names[id(head)]}.weight": f"{names[id(embedding)]}.weight"}


def suspects(
    model: Any,
    token_ids: Sequence[int],
    prompt_len: int,
    temperature: float,
    engine_logprobs: Sequence[float],
    initial_dir: Path,
) -> list[str]:
    """The layers that, put back to their weights in `initial_dir`, bring the trainer's
    log-probs closest to `engine_logprobs` (closing at least `SUSPECT_SHARE` of the
    difference), best first; empty when no single layer explains it."""
    from tracerl.models import read_safetensors

    initial = read_safetensors(initial_dir)
    tied = tied_names(model)
    device = next(model.parameters()).device

    def distance(params: dict[str, torch.Tensor] | None) -> float:
        ours = sequence_logprobs(model, token_ids, prompt_len, temperature, params)
        return max(abs(a - b) for a, b in zip(ours, engine_logprobs, strict=True))

    now = distance(None)
    found: list[tuple[float, str]] = []
    for layer, names in layer_groups(model).items():
        params = {}
        for name in names:
            stored = initial.get(name, initial.get(tied.get(name, "")))
            if stored is not None:
                params[name] = stored.to(device=device, dtype=model.dtype)
        if len(params) != len(names):
            continue  # not all in the initial files under these names: not diagnosable
        after = distance(params)
        if after <= now * (1 - SUSPECT_SHARE):
            tied_to = tied.get(names[0])
            label = f"{layer} (tied to {tied_to.rsplit('.', 1)[0]})" if tied_to else layer
            found.append((after, label))
    return [label for _, label in sorted(found)]
