"""The model checked before anything loads (`tracerl train`, after the config validates): each
failure is one line naming the config key and the fix (`ConfigError`, exit 2), instead of a
traceback after seconds of loading.

Read from the model directory's files only (its config and tokenizer, never the weights):
- `trainer.model` resolves: a built-in name, a directory with `config.json`, or a `.gguf` file
  (converted and cached on first use, which this triggers);
- the architecture is a causal LM transformers has a class for;
- `engine.max_model_len` fits the model's positions;
- the chosen engine can run it: `engine.forward = "slots"` needs a layout the slot cache runs
  exactly; vLLM's CPU build has no attention kernel below head size 32;
- there is a chat template (the tokenizer's, or `trainer.chat_template`), and it renders a
  conversation.
"""

from __future__ import annotations

from typing import Any

from tracerl.config import ConfigError
from tracerl.config.run import TrainCommandConfig

VLLM_CPU_MIN_HEAD_SIZE = 32


def check_model(config: TrainCommandConfig) -> None:
    """Raise `ConfigError` for the first problem found (see the module docstring)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from tracerl.models import ModelNotFoundError, resolve_model

    name = config.trainer.model
    try:
        path = resolve_model(name)
    except ModelNotFoundError as e:
        raise ConfigError(f"trainer.model: {e}") from None
    model = AutoConfig.from_pretrained(path)
    if model.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"trainer.model: {name} is a {model.model_type!r} model, which transformers has no "
            "causal language model class for; tracerl trains causal LMs"
        )
    _check_length(config, model)
    _check_engine(config, model)
    _check_template(config, path)


def _check_length(config: TrainCommandConfig, model: Any) -> None:
    positions = int(getattr(model, "max_position_embeddings", 0) or 0)
    wanted = config.engine.max_model_len
    if positions and wanted and wanted > positions:
        raise ConfigError(
            f"engine.max_model_len: {wanted} exceeds the {positions} positions of "
            f"{config.trainer.model}; set it to {positions} or less"
        )


def _check_engine(config: TrainCommandConfig, model: Any) -> None:
    engine = config.engine
    if engine.backend == "local" and engine.forward == "slots":
        from tracerl.engine.forward import slot_path_fits

        length = engine.max_model_len or int(getattr(model, "max_position_embeddings", 0) or 0)
        unfit = slot_path_fits(model, length)
        if unfit:
            raise ConfigError(
                f"engine.forward: the slot-cache path cannot run {config.trainer.model} "
                f"exactly ({unfit}); use engine.forward = 'auto' (the generic path)"
            )
    on_cpu = engine.device == "cpu" or (engine.device == "auto" and not _has_cuda())
    if engine.backend == "vllm" and on_cpu:
        heads = int(getattr(model, "num_attention_heads", 0) or 0)
        head = getattr(model, "head_dim", None) or (model.hidden_size // heads if heads else 0)
        if head and head < VLLM_CPU_MIN_HEAD_SIZE:
            raise ConfigError(
                f"engine.backend: vLLM's CPU build has no attention kernel for head size {head} "
                f"({config.trainer.model}); use engine.backend = 'local', or a GPU"
            )


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_template(config: TrainCommandConfig, path: Any) -> None:
    from tracerl.models import load_tokenizer

    template = config.trainer.chat_template
    try:
        tokenizer = load_tokenizer(path, template)
    except ValueError as e:  # not a built-in name nor a file
        raise ConfigError(f"trainer.chat_template: {e}") from None
    if not tokenizer.chat_template:
        raise ConfigError(
            f"trainer.chat_template: {config.trainer.model} has no chat template; set "
            "trainer.chat_template to a built-in one (chatml, gemma) or a Jinja file"
        )
    where = "trainer.chat_template" if template else f"trainer.model ({config.trainer.model})"
    try:
        tokenizer.apply_chat_template(
            [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
            add_generation_prompt=True,
            tokenize=False,
        )
    except Exception as e:  # a template error, in the template's own words
        raise ConfigError(f"{where}: the chat template does not render a chat: {e}") from None
