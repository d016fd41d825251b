"""A `.gguf` file as `trainer.model` (or any model setting): converted once into the cache, keyed
by the file, and then the same model as its built-in conversion."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tracerl.models import read_safetensors, resolve_model, smollm2_gguf_path

pytestmark = pytest.mark.e2e


def test_a_gguf_path_is_converted_once_and_is_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    builtin = resolve_model("smollm2-135m")  # the shared cache's conversion of the same file
    monkeypatch.setenv("TRACERL_CACHE", str(tmp_path / "cache"))
    gguf = smollm2_gguf_path()
    converted = resolve_model(str(gguf))
    assert converted.parent == tmp_path / "cache" / "models"
    assert converted.name.startswith(f"gguf-{gguf.stem}-")
    assert resolve_model(str(gguf)) == converted  # cached: not converted again
    ours, theirs = read_safetensors(converted), read_safetensors(builtin)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(builtin).chat_template
