"""The trainer's models: the actor (any Hugging Face causal LM), the critic derived from it, and
the frozen reference.

The critic is not a hand-written variant per architecture: `as_value_model(actor_config)` takes
the actor's own backbone class (`AutoModel`, stored under the actor's `base_model_prefix`) and
puts a `[hidden, 1]` head where the vocabulary head was, stored as `value_head.weight`. Every
backbone key is therefore the actor's key, so a critic initialises straight from an actor
checkpoint (its `lm_head` is ignored) and a critic checkpoint holds exactly the backbone plus
`value_head.weight` (`load_value_model(..., require_head=True)` insists on that).

A missing head is drawn from Normal(0, 1/(hidden + 1)) (Open-Reasoner-Zero), in place under
`no_grad`: the head is a leaf that requires grad, which autograd refuses to write in place
otherwise. The default 0.02-std init would emit values of arbitrary size that GAE spreads into
every advantage.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tracerl.models import load_tokenizer, read_safetensors, resolve_model

VALUE_HEAD_KEY = "value_head.weight"


class CheckpointKeyError(ValueError):
    """Weights whose names do not match the model they are loaded into."""


def load_actor(
    name_or_path: str, *, dtype: torch.dtype = torch.float32, chat_template: str | None = None
) -> tuple[Any, Any, Path]:
    """A causal LM and its tokenizer, by the names the engine takes (built-in, directory or
    GGUF file); `chat_template` replaces the tokenizer's (`trainer.chat_template`). Returns
    `(model, tokenizer, resolved directory)`; the model is on the CPU in train mode."""
    from transformers import AutoModelForCausalLM

    path = resolve_model(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.train()
    return model, load_tokenizer(path, chat_template), path


def load_reference(path: str | Path, *, dtype: torch.dtype = torch.float32) -> Any:
    """The frozen reference policy: the actor's initial weights, eval mode, no gradients."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model(str(path)), dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model


def init_value_head(head: nn.Linear, generator: torch.Generator | None = None) -> None:
    """Normal(0, std = 1 / (hidden + 1)) in place; safe on a leaf that requires grad."""
    with torch.no_grad():
        std = 1.0 / (head.in_features + 1)
        sample = torch.randn(head.weight.shape, generator=generator, dtype=torch.float32)
        head.weight.copy_(sample * std)


class ValueModel(nn.Module):
    """The actor's backbone and a scalar head: one value per position."""

    def __init__(self, config: Any, generator: torch.Generator | None = None) -> None:
        from transformers import AutoModel

        super().__init__()
        backbone = AutoModel.from_config(config)
        self.config = config
        self.prefix: str = backbone.base_model_prefix
        self.add_module(self.prefix, backbone)
        self.value_head = nn.Linear(config.hidden_size, 1, bias=False)
        init_value_head(self.value_head, generator)

    @property
    def backbone(self) -> nn.Module:
        module: nn.Module = getattr(self, self.prefix)
        return module

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        keep: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Values at the `keep` positions of `input_ids` `[R, L]`, flattened row-major. `[k]`"""
        hidden = self.backbone(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=False,
        ).last_hidden_state  # [R, L, H]
        return self.value_head(hidden[keep]).squeeze(-1).float()  # [k]


def as_value_model(actor_config: Any, *, seed: int = 0) -> ValueModel:
    """A critic for `actor_config`: same backbone, `value_head.weight` `[1, hidden]` (randomly
    initialised), untied embeddings, float32. Load weights with `load_value_state`."""
    config = copy.deepcopy(actor_config)
    config.tie_word_embeddings = False  # a [1, hidden] head cannot alias the embedding
    config.architectures = None  # not loadable as a causal LM: it has no vocabulary head
    model = ValueModel(config, torch.Generator().manual_seed(seed))
    return model.float()


def load_value_state(
    model: ValueModel,
    tensors: dict[str, torch.Tensor],
    *,
    require_head: bool = False,
    generator: torch.Generator | None = None,
) -> None:
    """Copy an actor's or a critic's weights into `model`.

    Every backbone key must be present and no unknown key may sit under the backbone prefix.
    Keys outside it (an actor's `lm_head.weight`) are ignored unless `require_head`, which
    demands exactly the critic's keys; without `value_head.weight` the head is initialised.
    """
    own = set(model.state_dict())
    prefix = f"{model.prefix}."
    backbone_keys = {k for k in own if k.startswith(prefix)}
    given = set(tensors)
    missing = sorted(backbone_keys - given)
    unknown = sorted(k for k in given - own if k.startswith(prefix) or require_head)
    if require_head and VALUE_HEAD_KEY not in given:
        missing.append(VALUE_HEAD_KEY)
    if missing or unknown:
        raise CheckpointKeyError(
            f"critic weights do not match the model: missing {_few(missing)}, "
            f"unexpected {_few(unknown)}"
        )
    state = {k: tensors[k] for k in backbone_keys}
    if VALUE_HEAD_KEY in given:
        state[VALUE_HEAD_KEY] = tensors[VALUE_HEAD_KEY]
    for key, tensor in state.items():
        target = model.state_dict()[key]
        if tuple(tensor.shape) != tuple(target.shape):
            raise CheckpointKeyError(
                f"weight {key}: shape {tuple(tensor.shape)} does not match the model's "
                f"{tuple(target.shape)}"
            )
    model.load_state_dict(state, strict=False)
    if VALUE_HEAD_KEY not in given:
        init_value_head(model.value_head, generator)


def value_model_from_actor(actor: nn.Module, *, seed: int = 0) -> ValueModel:
    """A critic whose backbone is a copy of `actor`'s current backbone (keys checked exactly)."""
    critic = as_value_model(actor.config, seed=seed)
    load_value_state(
        critic, dict(actor.state_dict()), generator=torch.Generator().manual_seed(seed)
    )
    return critic


def load_value_model(
    name_or_path: str,
    *,
    require_head: bool = False,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> ValueModel:
    """A critic from a directory of safetensors: an actor checkpoint (the head is initialised)
    or a critic checkpoint (`require_head=True` insists on an exact key match)."""
    from transformers import AutoConfig

    path = resolve_model(name_or_path)
    config = AutoConfig.from_pretrained(path)
    critic = as_value_model(config, seed=seed)
    try:
        tensors = read_safetensors(path)
    except FileNotFoundError:
        raise CheckpointKeyError(f"{path}: no .safetensors files") from None
    generator = torch.Generator().manual_seed(seed)
    load_value_state(critic, tensors, require_head=require_head, generator=generator)
    if dtype is not None:
        critic.to(dtype)
    return critic


def _few(keys: list[str]) -> str:
    return "[]" if not keys else f"{keys[:5]}{' ...' if len(keys) > 5 else ''}"
