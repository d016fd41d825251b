"""Shared fixtures: the `tiny` model (loaded once, copied per test so weight updates never leak),
engines built on it, and an engine served over HTTP on 127.0.0.1 with a free port."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import torch

from tracerl.config import EngineConfig
from tracerl.engine.local import LocalEngine
from tracerl.models import load_model_and_tokenizer


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    return load_model_and_tokenizer("tiny")


@pytest.fixture
async def make_engine(tiny: tuple[Any, Any]) -> AsyncIterator[Callable[..., LocalEngine]]:
    """Build started-on-first-use engines over a private copy of the tiny model."""
    engines: list[LocalEngine] = []
    model, tokenizer = tiny

    def build(**overrides: Any) -> LocalEngine:
        engine = LocalEngine(
            EngineConfig(model="tiny", **overrides), model=copy.deepcopy(model), tokenizer=tokenizer
        )
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        await engine.close()


def reference_logprobs(
    model: Any, prompt: list[int], output: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) at each output token, from one independent full forward pass."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # [len(output), V]
    scale = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits / scale, dim=-1)
    return logprobs.gather(-1, torch.tensor(output)[:, None])[:, 0]


def move_adapters(model: torch.nn.Module, seed: int, scale: float) -> None:
    """Move a LoRA model's adapters by seeded noise of `scale`, as updates would (its base
    cannot move): each seed a different policy."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.add_(scale * torch.randn_like(p))
