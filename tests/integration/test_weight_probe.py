"""The weight probe on the embedded engine (`tracerl.run.probe`): after a push, the engine's
log-probs of the probe equal the trainer's, for a tied and an untied model; an engine that kept
one layer at its initial weights fails the check with its name and that layer's, in the pool
and through `tracerl train`, which stops with a one-line error; a correct bfloat16 engine of the
real model passes (slow)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import move_adapters
from tracerl.config import EngineConfig, PoolConfig
from tracerl.config.train import TrainerConfig
from tracerl.engine.local import LocalEngine
from tracerl.models import read_safetensors, resolve_model
from tracerl.rollout.pool import EnginePool, Member
from tracerl.run.probe import PROBE_TEXT, TOLERANCE, Probe, WeightProbeError, check
from tracerl.train import Trainer


@pytest.fixture(scope="module")
def tied_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny` with its output layer tied to its embedding (SmolLM2 and Gemma 3 tie theirs)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = resolve_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(base, tie_word_embeddings=True)
    out = tmp_path_factory.mktemp("tied-tiny")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def kept_at_initial(
    tensors: Iterable[tuple[str, torch.Tensor]], initial_dir: Path, layer: str
) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a push, with `layer`'s put back to the initial ones: what an engine whose
    loader skipped that layer runs."""
    initial = read_safetensors(initial_dir)
    return [(n, initial[n] if n.startswith(f"{layer}.") else t) for n, t in tensors]


@contextlib.asynccontextmanager
async def one_engine_pool(engine: LocalEngine) -> AsyncIterator[EnginePool]:
    """A started pool of `engine` alone (`embedded-0`), closed with the engine after."""
    pool = EnginePool([Member("embedded-0", engine)], PoolConfig(health_interval_s=60))
    await engine.start()
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()
        await engine.close()


def train_a_little(trainer: Trainer) -> None:
    """Every weight moves, as after an update (the probe does not care how)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in trainer.actor.parameters():
            p.add_(0.05 * torch.randn_like(p))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
async def test_a_push_passes_the_probe_and_a_skipped_layer_fails_it_by_name(
    tied: bool, tied_tiny: Path
) -> None:
    model = str(tied_tiny) if tied else "tiny"
    trainer = Trainer(TrainerConfig(model=model, token_budget=256), device="cpu")
    assert bool(trainer.actor.config.tie_word_embeddings) == tied
    engine = LocalEngine(EngineConfig(model=model, device="cpu", kv_cache_tokens=1024))
    async with one_engine_pool(engine) as pool:
        prompt = trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        probe = Probe(prompt, 1.0, TOLERANCE["float32"])
        assert await check(pool, trainer, probe, 0) < 1e-4  # the base weights on both sides
        train_a_little(trainer)
        await pool.update_weights(None, 1, trainer.actor_named_tensors())
        assert await check(pool, trainer, probe, 1) < 1e-4
        stale = kept_at_initial(trainer.actor_named_tensors(), trainer.model_path, "model.layers.1")
        await pool.update_weights(None, 2, stale)
        with pytest.raises(WeightProbeError) as failed:
            await check(pool, trainer, probe, 2)
    message = str(failed.value)
    assert message.startswith("engine 'embedded-0': after loading the weights of step 2")
    assert "at their initial weights: model.layers.1." in message


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
async def test_lora_pushes_merged_or_adapter_alone_pass_the_probe_and_a_stale_engine_fails(
    tied: bool, tied_tiny: Path
) -> None:
    """`[trainer.lora]`: a merged push (the base plus the adapters under the base's names) and
    an adapter push (the adapters alone, applied in the engine's forward) both leave the engine
    sampling as the adapted actor; an engine left on the base, or on an older adapter, fails;
    a bad adapter push is refused whole and the engine keeps serving the adapter it had."""
    from tracerl.engine.adapters import AdapterWeights
    from tracerl.engine.types import WeightLoadError

    model = str(tied_tiny) if tied else "tiny"
    trainer = Trainer(TrainerConfig(model=model, token_budget=256, lora={"rank": 4}), device="cpu")
    merged_engine = LocalEngine(EngineConfig(model=model, device="cpu", kv_cache_tokens=1024))
    adapted_engine = LocalEngine(EngineConfig(model=model, device="cpu", kv_cache_tokens=1024))
    engines = {"merged": merged_engine, "adapted": adapted_engine}
    pools = {
        n: EnginePool([Member(n, e)], PoolConfig(health_interval_s=60)) for n, e in engines.items()
    }
    for name in engines:
        await engines[name].start()
        await pools[name].start()
    prompt = trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    probe = Probe(prompt, 1.0, TOLERANCE["float32"])

    try:
        move_adapters(trainer.actor, 1, 0.5)
        with pytest.raises(WeightProbeError):  # the engine still holds the base
            await check(pools["adapted"], trainer, probe, 0)
        await pools["merged"].update_weights(None, 1, trainer.actor_named_tensors())
        first = trainer.adapter_weights()
        assert first is not None
        await pools["adapted"].update_weights(None, 1, adapter=first)
        assert first.nbytes * 100 < sum(t.nbytes for _, t in trainer.actor_named_tensors())
        for pool in pools.values():
            assert await check(pool, trainer, probe, 1) < 1e-4
        kept = {k: v.clone() for k, v in first.tensors.items()}
        move_adapters(trainer.actor, 2, 0.5)  # step 2: the engine takes the new adapter in place
        await pools["adapted"].update_weights(None, 2, adapter=trainer.adapter_weights())
        assert await check(pools["adapted"], trainer, probe, 2) < 1e-4
        key = next(iter(kept))
        bad = {
            "shape": {**kept, key: kept[key][:, :-1]},
            "NaN": {**kept, key: torch.full_like(kept[key], float("nan"))},
            "missing": {k: v for k, v in kept.items() if k != key},
        }
        for what, tensors in bad.items():
            with pytest.raises(WeightLoadError):
                await adapted_engine.update_adapter(
                    AdapterWeights("policy", first.config, tensors), 3
                )
            assert adapted_engine.weight_version == 2, what
        assert await check(pools["adapted"], trainer, probe, 2) < 1e-4  # still step 2's
        await pools["adapted"].update_weights(
            None, 3, adapter=AdapterWeights("policy", first.config, kept)
        )
        with pytest.raises(WeightProbeError):  # an older adapter is not the trainer's
            await check(pools["adapted"], trainer, probe, 3)
        base = read_safetensors(trainer.model_path)
        await pools["merged"].update_weights(None, 2, base.items())
        with pytest.raises(WeightProbeError):
            await check(pools["merged"], trainer, probe, 2)
    finally:
        for name in engines:
            await pools[name].close()
            await engines[name].close()


def test_train_stops_when_an_engine_did_not_get_the_weights_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tracerl train` (in process) whose embedded engine skips the output layer on every
    push: the first push fails the probe, the run stops with exit 1 and one line naming the
    engine and the layer, and the step that could not be served is not recorded. (lr 1e-3: the
    head's difference after one step is ~10x the float32 tolerance; at tiny.toml's 1e-4 it was
    8.4e-4, 4x.)"""
    from tracerl.cli.train import prepare_run_dir, run_train
    from tracerl.config import load_config
    from tracerl.config.run import TrainCommandConfig

    load = LocalEngine.update_weights

    async def skipping(self: Any, named: Iterable[tuple[str, Any]], version: int) -> None:
        await load(self, kept_at_initial(named, resolve_model("tiny"), "lm_head"), version)

    monkeypatch.setattr(LocalEngine, "update_weights", skipping)
    config = load_config(
        TrainCommandConfig,
        "examples/tiny.toml",
        # float32 engine (on a GPU it would default to bfloat16, whose tolerance is wider)
        [
            "--loop.steps=2",
            "--logging.progress=false",
            "--trainer.actor.lr=1e-3",
            "--engine.dtype=float32",
        ],
    )
    run_dir = prepare_run_dir("examples/tiny.toml", str(tmp_path / "run"), resume=False)
    assert run_train(config, run_dir) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("tracerl train: engine 'local': after loading the weights of step 1")
    assert "at their initial weights: lm_head." in err
    assert not (tmp_path / "run" / "metrics.jsonl").read_text().strip()


async def test_an_engine_lost_since_the_push_is_left_to_the_pool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A probe request that fails (the engine died after loading) does not stop the run: the
    pool's health checks take the engine out and restart it."""
    from types import SimpleNamespace

    class Lost:
        async def generate(self, request: Any) -> Any:
            raise ConnectionError("connection refused")

    pool: Any = SimpleNamespace(members=[Member("gone", Lost())], adapter=None)
    assert await check(pool, object(), Probe([1, 2, 3], 1.0, 2e-4), 3) == 0.0
    assert "engine gone could not be probed at v3: ConnectionError" in caplog.text


@pytest.mark.slow
async def test_a_correct_bfloat16_engine_passes_the_probe_on_the_real_model() -> None:
    """The half-precision tolerance is wide enough for a correct engine: the float32 trainer
    against a bfloat16 engine of the same weights, over many probes (the old 0.2 failed)."""
    trainer = Trainer(TrainerConfig(model="smollm2-135m", algorithm="grpo"), device="cpu")
    engine = LocalEngine(EngineConfig(model="smollm2-135m", device="cpu", dtype="bfloat16"))
    async with one_engine_pool(engine) as pool:
        prompt = trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        probe = Probe(prompt, 1.0, TOLERANCE["bfloat16"])
        worst = [await check(pool, trainer, probe, 0) for _ in range(24)]
    assert max(worst) > 2e-4  # half precision: not the float32 engine's agreement
