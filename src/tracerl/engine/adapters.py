"""LoRA adapters in the embedded engine: a push of the adapters alone, the last one merged.

An adapter (peft's config and its tensors under the keys of peft's files,
`base_model.model.<layer>.lora_A.weight`) is injected as peft LoRA layers on its first load and
copied into place on every later one, so a training step's sync moves the adapters' bytes only
(a few MB).

The adapter loaded last is also **merged**: its delta `(alpha / rank) * B @ A` is added into
the base weights of float32 models, so a forward step whose sequences all use it is the plain
model's forward. Applied in the forward instead (peft's `base(x) + (alpha / rank) * B(A(x))` on
every adapted layer), it made decoding 1.35x slower (SmolLM2-135M, rank 16 on every linear
layer, 32 requests of 12 tokens: 135 tokens/s against 182), while a merge takes one matrix
product per layer at each push. A push of the merged adapter takes the old delta out before the
new one goes in; float32 rounding adds ~1e-9 to a weight per push. Half-precision weights would
lose the small deltas to rounding, so there every adapter stays in the forward.

Several adapters live in one model side by side (one per name: a run, or a run's older
version under evaluation); `adapters_for` makes one forward apply to each sequence its own
adapter, or the base alone: the others' deltas, less the merged one's, are added at their
positions.

A load is validated whole (every tensor of the adapter present, names, shapes, finite values)
before anything is written, like a full weight load (`tracerl.engine.weights`), so a bad push
leaves the engine serving its previous adapter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tracerl.engine.types import WeightLoadError

PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class AdapterWeights:
    """One adapter push: its name in the engine, peft's config fields (`r`, `lora_alpha`,
    `use_rslora`) and its tensors under peft's file keys."""

    name: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@dataclass(frozen=True)
class AdapterFiles:
    """One adapter push to engine servers: its name there and the directory (peft's layout:
    `adapter_config.json`, `adapter_model.safetensors`) they load it from."""

    name: str
    path: str


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def read_adapter_dir(name: str, path: str) -> AdapterWeights:
    """Adapter `name` from peft's directory layout; `WeightLoadError` naming what is wrong."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    root = Path(path)
    try:
        config = json.loads((root / ADAPTER_CONFIG).read_text())
        tensors = load_file(str(root / ADAPTER_WEIGHTS))
    except FileNotFoundError as e:
        raise WeightLoadError(f"adapter {name!r}: {e.filename} does not exist") from None
    except (OSError, ValueError) as e:  # unreadable, not JSON, not safetensors
        raise WeightLoadError(f"adapter {name!r}: {path} is not a peft adapter: {e}") from None
    if not isinstance(config, dict):
        raise WeightLoadError(f"adapter {name!r}: {ADAPTER_CONFIG} is not a JSON object")
    return AdapterWeights(name, config, tensors)


def adapter_parameters(model: Any, name: str) -> dict[str, torch.Tensor]:
    """Adapter `name`'s parameters in `model`, by the key its files use."""
    marker = f".{name}."
    out = {}
    for key, param in model.named_parameters():
        if ".lora_" in key and marker in key:
            out[PEFT_PREFIX + key.replace(marker, ".")] = param
    return out


def has_adapter(model: Any, name: str) -> bool:
    return bool(adapter_parameters(model, name))


def load_adapter(
    model: Any, name: str, config: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    """Put adapter `name` into `model`: injected (frozen, eval mode) on its first load into
    exactly the layers its tensors name, with `config`'s rank and alpha (peft's `r`,
    `lora_alpha`, `use_rslora`); its tensors copied in on every load."""
    from peft import LoraConfig, inject_adapter_in_model

    merged = merged_adapter(model)
    if not has_adapter(model, name):
        layers = _check(name, _expected_shapes(model, name, config, tensors), tensors)
        peft_config = LoraConfig(
            r=int(config["r"]),
            lora_alpha=config["lora_alpha"],
            use_rslora=bool(config.get("use_rslora", False)),
            target_modules=sorted(layers),
            bias="none",
        )
        inject_adapter_in_model(peft_config, model, adapter_name=name)
        model.requires_grad_(False)
        model.eval()
        model._tracerl_tuner_layers = None  # found again on the next step
        model._tracerl_active = None  # peft may have switched the layers to the new one
    targets = adapter_parameters(model, name)
    _check(name, {k: tuple(v.shape) for k, v in targets.items()}, tensors)
    tuners = _tuner_layers(model)
    if merged is not None:  # the base weights lose the merged delta before anything changes
        _add_delta(tuners, merged, -1.0)
        model._tracerl_merged = None
    with torch.no_grad():
        for key, tensor in tensors.items():
            targets[key].copy_(tensor.to(targets[key].device, targets[key].dtype))
    if all(layer.get_base_layer().weight.dtype == torch.float32 for layer in tuners):
        _add_delta(tuners, name, 1.0)
        model._tracerl_merged = name
        model._tracerl_active = None


def merged_adapter(model: Any) -> str | None:
    """The adapter whose delta the base weights hold (None: they are the base's own)."""
    return getattr(model, "_tracerl_merged", None)


def _add_delta(layers: list[Any], name: str, sign: float) -> None:
    """Add `sign` x adapter `name`'s delta weight into the base weights of the layers it adapts."""
    with torch.no_grad():
        for layer in layers:
            if name in layer.lora_A:
                weight = layer.get_base_layer().weight
                weight.add_(layer.get_delta_weight(name).to(weight.dtype), alpha=sign)


def _expected_shapes(
    model: Any, name: str, config: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> dict[str, tuple[int, ...]]:
    """The tensors a new adapter of rank `config["r"]` needs on the linear layers `tensors`
    name: A `[r, in]` and B `[out, r]` for each."""
    try:
        rank = int(config["r"])
        float(config["lora_alpha"])
    except (KeyError, TypeError, ValueError):
        raise WeightLoadError(
            f"adapter {name!r}: its config needs a rank `r` and `lora_alpha`"
        ) from None
    modules = dict(model.named_modules())
    expected: dict[str, tuple[int, ...]] = {}
    for key in tensors:
        layer, _, kind = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        module = modules.get(layer)
        if not key.startswith(PEFT_PREFIX) or kind not in ("A.weight", "B.weight"):
            continue  # reported as unknown
        if module is not None and hasattr(module, "get_base_layer"):  # another adapter's layer
            module = module.get_base_layer()
        if not isinstance(module, torch.nn.Linear):
            raise WeightLoadError(f"adapter {name!r}: {layer} is not a linear layer of the model")
        for side, shape in (("A", (rank, module.in_features)), ("B", (module.out_features, rank))):
            expected[f"{PEFT_PREFIX}{layer}.lora_{side}.weight"] = shape
    return expected


def _check(
    name: str, expected: dict[str, tuple[int, ...]], tensors: dict[str, torch.Tensor]
) -> set[str]:
    """Refuse `tensors` unless they are exactly `expected`; the layers they adapt."""
    unknown = sorted(set(tensors) - set(expected))
    missing = sorted(set(expected) - set(tensors))
    if unknown or missing or not tensors:
        raise WeightLoadError(
            f"adapter {name!r}: unknown tensors {unknown[:3]}, missing tensors {missing[:3]}"
        )
    for key, tensor in tensors.items():
        if tuple(tensor.shape) != expected[key]:
            raise WeightLoadError(
                f"adapter {name!r}: {key} has shape {tuple(tensor.shape)}, the model's layer "
                f"takes {expected[key]}"
            )
        if not torch.isfinite(tensor).all():
            raise WeightLoadError(f"adapter {name!r}: {key} contains NaN or infinity")
    return {k.removeprefix(PEFT_PREFIX).rpartition(".lora_")[0] for k in tensors}


def tuner_layers(model: Any) -> dict[str, Any]:
    """The model's LoRA layers (peft's), by module name."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)}


def _tuner_layers(model: Any) -> list[Any]:
    """`tuner_layers`, found once per injection (every engine step asks)."""
    found = getattr(model, "_tracerl_tuner_layers", None)
    if found is None:
        found = list(tuner_layers(model).values())
        model._tracerl_tuner_layers = found
    return list(found)


@contextlib.contextmanager
def adapters_for(model: Any, names: Sequence[str | None]) -> Iterator[None]:
    """Under this, `model`'s LoRA layers apply `names[i]` to token position `i` of their
    input, counted over its leading dimensions flattened (None: the base alone). All on the
    merged adapter: the plain forward. One other name for all, nothing merged: peft's own path.
    Otherwise the (possibly merged) base weights' forward runs once and each position gets its
    adapter's (alpha / rank) * B(A(x)), less the merged adapter's."""
    layers = _tuner_layers(model)
    distinct = set(names)
    merged = merged_adapter(model)
    if not layers:
        asked = sorted(n for n in distinct if n is not None)
        if asked:
            raise WeightLoadError(f"no adapter is loaded; asked for {asked}")
        yield
        return
    if distinct == {merged} or (len(distinct) == 1 and merged is None):
        _activate(model, layers, None if merged is not None else next(iter(distinct)))
        yield
        return
    _activate(model, layers, None)  # each layer's forward gives the weights'; the hooks correct
    device = next(model.parameters()).device
    index: dict[str | None, torch.Tensor | None] = {
        n: torch.tensor([i for i, m in enumerate(names) if m == n], device=device)
        for n in distinct
        if n != merged
    }
    if len(distinct) == 1:  # one name for every position, however many the input has
        index = {n: None for n in index}
    handles = [layer.register_forward_hook(_add_deltas(index, merged)) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _activate(model: Any, layers: list[Any], name: str | None) -> None:
    """Every layer on adapter `name` (None: off); skipped when they already are."""
    state = ("on", name) if name is not None else ("off", None)
    if getattr(model, "_tracerl_active", None) == state:
        return
    model._tracerl_active = state
    for layer in layers:
        if name is None:
            layer.enable_adapters(False)
        else:
            layer.enable_adapters(True)
            layer.set_adapter(name)


def _add_deltas(index: dict[str | None, torch.Tensor | None], merged: str | None) -> Any:
    """A forward hook adding, at each name's positions (None: all), its adapter's delta less
    the merged adapter's (the layer's weights hold that one)."""

    def delta(module: Any, name: str | None, sign: float, rows: torch.Tensor) -> torch.Tensor:
        a, b = module.lora_A[name], module.lora_B[name]
        out: torch.Tensor = b(a(rows.to(a.weight.dtype))) * (module.scaling[name] * sign)
        return out

    def hook(module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        x = args[0]
        flat_x = x.reshape(-1, x.shape[-1])
        flat_out = output.view(-1, output.shape[-1])
        for name, positions in index.items():
            terms = [(n, s) for n, s in ((name, 1.0), (merged, -1.0)) if n in module.lora_A]
            if not terms:
                continue  # neither adapter touches this layer
            rows = flat_x if positions is None else flat_x.index_select(0, positions)
            change = delta(module, *terms[0], rows)
            for n, s in terms[1:]:
                change = change + delta(module, n, s, rows)
            change = change.to(flat_out.dtype)
            if positions is None:
                flat_out.add_(change)
            else:
                flat_out.index_add_(0, positions, change)
        return output

    return hook
