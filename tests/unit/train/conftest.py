"""Fixtures of the trainer tests: hand-built trajectories on the `tiny` model, and one torch
thread (the CPUs are shared; oversubscribed OpenMP threads make tiny forwards 10x slower)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from tracerl.config.train import TrainerConfig
from tracerl.train.batch import TrainSample
from tracerl.train.trainer import Trainer

# Context tokens are drawn below this id, action tokens at or above it, so a test can tell them
# apart from the model input alone.
ACTION_MIN_ID = 1000


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_samples(
    seed: int, count: int = 6, group_size: int = 2, turns: int = 2
) -> list[TrainSample]:
    """Multi-turn trajectories: context runs (ids < ACTION_MIN_ID) and action runs (ids >=
    ACTION_MIN_ID) alternate, lengths vary; rewards differ inside each group."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        ids: list[int] = []
        mask: list[int] = []
        for _ in range(turns):
            ctx = int(torch.randint(2, 7, (1,), generator=g))
            act = int(torch.randint(1, 6, (1,), generator=g))
            ids += torch.randint(3, ACTION_MIN_ID, (ctx,), generator=g).tolist()
            ids += torch.randint(ACTION_MIN_ID, 40000, (act,), generator=g).tolist()
            mask += [0] * ctx + [1] * act
        # near what the near-uniform tiny model assigns (log 1/49280 = -10.8): TIS weights ~ 1
        logprobs = [
            -10.8 + 0.6 * float(torch.rand((), generator=g)) - 0.3 if m else 0.0 for m in mask
        ]
        out.append(TrainSample(ids, mask, logprobs, float(i % group_size), i // group_size, i // 3))
    return out


def config(**overrides: Any) -> TrainerConfig:
    base: dict[str, Any] = {
        "model": "tiny",
        "actor": {"lr": 1e-3},
        "critic": {"lr": 1e-3},
        "token_budget": 64,
        "total_steps": 20,
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return TrainerConfig.model_validate(base)


@pytest.fixture
def make_trainer() -> Callable[..., Trainer]:
    def build(**overrides: Any) -> Trainer:
        return Trainer(config(**overrides), device="cpu")

    return build
