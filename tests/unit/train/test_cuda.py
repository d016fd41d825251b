"""The trainer on CUDA with offloading between phases (run where a GPU exists: `pytest -m gpu`)."""

from collections.abc import Callable

import pytest
import torch

from tracerl.train.trainer import Trainer

from .conftest import config, make_samples

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def devices(trainer: Trainer) -> set[str]:
    out = set()
    for model in trainer._models().values():
        out |= {p.device.type for p in model.parameters()}
    for opt in (trainer.actor_optimizer, trainer.critic_optimizer):
        for state in opt.state.values() if opt is not None else []:
            out |= {v.device.type for v in state.values() if v.dim() > 0}
    return out


def test_offloaded_ppo_step_matches_the_cpu(make_trainer: Callable[..., Trainer]) -> None:
    overrides = {"algorithm": "ppo", "kl_reward_coef": 0.05, "actor": {"mini_batches": 2}}
    samples = make_samples(0, count=6)
    cpu = make_trainer(**overrides)
    gpu = Trainer(cpu.config, device="cuda")
    assert devices(gpu) == {"cpu"}  # models start on the host: the machine starts in IDLE
    want, got = cpu.step(samples), gpu.step(samples)
    assert gpu.phases.transfers == [
        ("reference", "device"), ("reference", "host"), ("actor", "device"), ("actor", "host"),
        ("critic", "device"), ("critic", "host"), ("actor", "device"), ("actor", "host"),
    ]  # fmt: skip
    assert devices(gpu) == {"cpu"}  # optimizer state included
    for key in ("actor/policy_loss", "critic/value_loss", "critic/return_mean", "kl/ref_mean"):
        assert got[key] == pytest.approx(want[key], rel=1e-3, abs=1e-6), key
    second = gpu.step(samples)  # optimizer state created on the device comes back in
    assert torch.isfinite(torch.tensor(second["actor/policy_loss"]))


def test_resident_training_in_bfloat16() -> None:
    cfg = config(algorithm="grpo", dtype="bfloat16", offload_models=False)
    trainer = Trainer(cfg, device="cuda")
    metrics = trainer.step(make_samples(1, count=6))
    assert trainer.phases.transfers == [] and devices(trainer) == {"cuda"}
    assert torch.isfinite(torch.tensor(metrics["actor/policy_loss"]))
