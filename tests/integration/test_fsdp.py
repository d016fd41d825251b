"""The trainer on a process group of 2 ranks (gloo on the CPU, FSDP2-sharded models) against the
single-process trainer on the same batches: the same losses and the same updated weights, and
checkpoints that move between 1 and 2 ranks.

Tolerance: the default `assert_close` one for float32. A sharded step computes the same sums
in another order (each rank's micro-batch gradients, then their reduce-scatter; the gradient
norm as a sum of per-shard norms), so results agree to float32 rounding, not bit for bit; the
learning rate is large (1e-3) so that the weights' change dwarfs that rounding."""

from __future__ import annotations

import dataclasses
import multiprocessing
import socket
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tracerl.train.trainer import Trainer

from ..unit.train.conftest import config, make_samples

RANK_DEADLINE_S = 240  # a generous bound on two tiny ranks; a hang fails instead of blocking CI
WATCHED = (
    "actor/policy_loss",
    "actor/kl_loss",
    "critic/value_loss",
    "actor/grad_norm",
    "reward/mean",
)

SETUPS: dict[str, dict[str, Any]] = {
    # several updates (a global shuffle cut into mini-batches), critic epochs, KL in reward
    "ppo": {
        "algorithm": "ppo",
        "actor": {"mini_batches": 2},
        "critic": {"epochs": 2},
        "kl_reward_coef": 0.05,
    },
    # one critic update: the values come from its own forward, per rank's shard
    "ppo_one_critic_update": {
        "algorithm": "ppo",
        "actor": {"mini_batches": 2},
        "kl_reward_coef": 0.05,
        "lam": 0.9,
    },
    # a uniform group (zero-gradient samples never forwarded), the KL loss off then on
    "grpo": {"algorithm": "grpo", "actor": {"epochs": 2}},
    "grpo_kl": {"algorithm": "grpo", "kl_loss_coef": 0.05, "batching": "pad"},
    # a rank whose whole share is uniform groups: it forwards only lockstep padding and records
    # fewer metrics than its peer (which once made their reductions differ in length)
    "grpo_one_rank_idle": {"algorithm": "grpo", "uniform_groups": 3},
}


def batches(n: int, uniform_groups: int = 1) -> list[Any]:
    """Steps of 8 samples in 4 groups of 2; the first `uniform_groups` carry no signal (their
    samples are skipped without a KL loss)."""
    out = []
    for s in range(n):
        samples = make_samples(20 + s, count=8)
        for g in range(uniform_groups):
            first, second = 2 * g, 2 * g + 1
            samples[first] = dataclasses.replace(samples[first], reward=samples[second].reward)
        out.append(samples)
    return out


def run(trainer: Trainer, work: dict[str, Any]) -> dict[str, Any]:
    if work.get("load"):
        trainer.load_checkpoint(work["load"])
    metrics = [{k: m[k] for k in WATCHED if k in m} for m in map(trainer.step, work["batches"])]
    if work.get("save"):
        trainer.save_checkpoint(work["save"], loop_state={"ranks": trainer.world_size})
    if work.get("export"):
        trainer.export(work["export"] / f"ranks-{trainer.world_size}")
    states = trainer._full_states()  # gathered on rank 0 when sharded
    return {"metrics": metrics, "states": states}


def rank_main(rank: int, world_size: int, port: int, work: dict[str, Any], out: Path) -> None:
    from tracerl.train.shard import join_process_group

    try:
        torch.set_num_threads(1)
        backend = work.get("backend", "gloo")
        join_process_group(f"127.0.0.1:{port}", rank, world_size, backend, timeout_s=30)
        result = run(Trainer(config(**work["config"]), device=work.get("device", "cpu")), work)
        if rank == 0:
            torch.save(result, out)
    except BaseException:
        (out.parent / f"error-{rank}.txt").write_text(traceback.format_exc())
        raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def on_ranks(world_size: int, work: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """`work` on a fresh process group of `world_size` ranks (one rank: in this process, with
    no group, unless `work["spawn"]`); rank 0's result."""
    if world_size == 1 and not work.get("spawn"):
        return run(Trainer(config(**work["config"]), device=work.get("device", "cpu")), work)
    ctx = multiprocessing.get_context("spawn")
    out = tmp / f"result-{world_size}-{id(work)}.pt"
    port = free_port()
    procs = [
        ctx.Process(target=rank_main, args=(r, world_size, port, work, out))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(RANK_DEADLINE_S)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    errors = sorted(tmp.glob("error-*.txt"))
    assert not errors, "\n".join(e.read_text()[-3000:] for e in errors)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return dict(torch.load(out, weights_only=False))


def assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert len(got["metrics"]) == len(expected["metrics"])
    for g, e in zip(got["metrics"], expected["metrics"], strict=True):
        assert g.keys() == e.keys()
        for key in e:
            # float32 quantities (reported as Python floats): float32's default tolerance
            got_value, expected_value = torch.tensor(g[key]), torch.tensor(e[key])
            torch.testing.assert_close(
                got_value, expected_value, msg=f"{key}: {g[key]} vs {e[key]}"
            )
    assert got["states"].keys() == expected["states"].keys()
    for model, state in expected["states"].items():
        for name, tensor in state.items():
            torch.testing.assert_close(got["states"][model][name], tensor, msg=f"{model} {name}")


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_two_ranks_make_the_single_process_step(tiny: Any, tmp_path: Path, setup: str) -> None:
    options = dict(SETUPS[setup])
    uniform = options.pop("uniform_groups", 1)
    work = {"config": options, "batches": batches(2, uniform), "export": tmp_path}
    single = on_ranks(1, work, tmp_path)
    sharded = on_ranks(2, work, tmp_path)
    assert_same(sharded, single)
    # the engines' weights: the sharded export is the gathered actor (and critic)
    parts = ("model.safetensors", "critic/model.safetensors")
    for part in parts[: 2 if setup.startswith("ppo") else 1]:
        one, two = (load_file(tmp_path / f"ranks-{n}" / part) for n in (1, 2))
        assert one.keys() == two.keys()
        for name in one:
            torch.testing.assert_close(two[name], one[name], msg=f"{part} {name}")
    first = single["states"]["actor"]
    initial = Trainer(config(**options), device="cpu").actor.state_dict()
    assert any(not torch.equal(first[k], initial[k]) for k in initial)  # the steps moved it


@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_rank_count(
    tiny: Any, tmp_path: Path, saved_on: int, resumed_on: int
) -> None:
    setup = SETUPS["ppo"]
    steps = batches(3)
    straight = on_ranks(1, {"config": setup, "batches": steps}, tmp_path)
    on_ranks(saved_on, {"config": setup, "batches": steps[:2], "save": tmp_path / "ckpt"}, tmp_path)
    resumed = on_ranks(
        resumed_on, {"config": setup, "batches": steps[2:], "load": tmp_path / "ckpt"}, tmp_path
    )
    assert_same(resumed, {**straight, "metrics": straight["metrics"][2:]})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_one_rank_nccl_group_makes_the_single_process_step(tiny: Any, tmp_path: Path) -> None:
    """On GPUs the trainer's collectives run over NCCL, which reduces CUDA tensors only, while
    its counts and metrics start on the host. Sharding needs two GPUs; one rank in a group
    runs every collective of a PPO step."""
    work = {"config": SETUPS["ppo"], "batches": batches(2), "device": "cuda", "backend": "nccl"}
    alone = on_ranks(1, work, tmp_path)
    grouped = on_ranks(1, {**work, "spawn": True}, tmp_path)
    assert_same(grouped, alone)
