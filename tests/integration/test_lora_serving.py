"""LoRA adapters on tracerl's engine server: `/load_lora_adapter` loads peft's adapter
directory by name; two runs (two trainers, two pools) share one engine, each sampled by its
own adapter and each passing its own weight probe; `tracerl train` against an attached engine
pushes its adapter alone; bad adapter pushes get a 400 naming what is wrong."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from tests.conftest import move_adapters
from tracerl.config import PoolConfig
from tracerl.config.train import TrainerConfig
from tracerl.engine.adapters import AdapterFiles
from tracerl.engine.client import EngineClient
from tracerl.engine.server import build_engine_app, start_server
from tracerl.engine.types import GenerateRequest
from tracerl.rollout.pool import EnginePool, Member
from tracerl.run.probe import PROBE_TEXT, TOLERANCE, Probe, check
from tracerl.train import Trainer


@pytest.fixture
async def served(make_engine: Any) -> AsyncIterator[str]:
    engine = make_engine(max_model_len=512)
    runner, port = await start_server(build_engine_app(engine), "127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def trained(seed: int) -> Trainer:
    """A LoRA trainer whose adapters moved (as after updates): each seed a different policy."""
    trainer = Trainer(TrainerConfig(model="tiny", token_budget=256, lora={"rank": 4}), "cpu")
    move_adapters(trainer.actor, seed, 0.5)
    return trainer


async def test_two_runs_share_one_engine_each_sampled_by_its_own_adapter(
    served: str, tmp_path: Path
) -> None:
    runs = {name: trained(seed) for name, seed in (("run-a", 1), ("run-b", 2))}
    pools = {
        name: EnginePool([Member("shared", EngineClient(served))], PoolConfig()) for name in runs
    }
    versions = {"run-a": 3, "run-b": 7}  # each run counts its own steps
    try:
        for name, trainer in runs.items():
            path = trainer.write_adapter(tmp_path / name / "adapter")
            assert sorted(p.name for p in path.iterdir()) == [
                "adapter_config.json",
                "adapter_model.safetensors",
            ]
            files = AdapterFiles(name, str(path))
            await pools[name].update_weights(None, versions[name], adapter_files=files)
        for name, trainer in runs.items():
            prompt = trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
            probe = Probe(prompt, 1.0, TOLERANCE["float32"])
            assert await check(pools[name], trainer, probe, versions[name]) < 1e-4, name

        async def sampled(name: str, seed: int) -> tuple[str, list[int], Any]:
            prompt = list(range(100 + seed, 130 + seed))
            request = GenerateRequest(
                rid=f"{name}-{seed}",
                input_ids=prompt,
                sampling_params={"max_new_tokens": 6, "temperature": 1.0, "seed": seed},
            )
            return name, prompt, await pools[name].generate(request)

        # both runs' requests at once: the engine serves the two adapters side by side
        outs = await asyncio.gather(*(sampled(n, s) for s in range(3) for n in runs))
        for name, prompt, out in outs:
            # labelled with the adapter that sampled them and its version, not the other's
            assert (out.adapter, out.weight_version) == (name, versions[name])
            ours = runs[name].probe_logprobs(prompt + out.output_ids, len(prompt))
            torch.testing.assert_close(
                torch.tensor(out.output_logprobs), torch.tensor(ours), atol=1e-4, rtol=0
            )
    finally:
        for pool in pools.values():
            await pool.close()


async def test_the_gateway_routes_by_session_or_model_and_the_trace_names_the_adapter(
    served: str, tmp_path: Path, make_gateway: Any
) -> None:
    """A run and an eval of its older adapter on one engine: the run's pool samples with its
    own adapter by default; a session created with `adapter`, or a request whose `model` names
    a loaded adapter, is sampled by that one; each turn's trace names the adapter and its
    version, and its log-probs are that adapter's."""
    import openai

    runs = {"old": trained(1), "new": trained(2)}
    pool = EnginePool([Member("shared", EngineClient(served))], PoolConfig())
    versions = {"old": 4, "new": 9}
    try:
        for name, trainer in runs.items():  # "new" last: the pool's own adapter
            files = AdapterFiles(name, str(trainer.write_adapter(tmp_path / name)))
            await pool.update_weights(None, versions[name], adapter_files=files)
        gateway = await make_gateway(pool)
        cases = {  # session body, request model -> the adapter expected
            "default": ({}, "tiny", "new"),
            "session": ({"adapter": "old"}, "tiny", "old"),
            "model": ({}, "old", "old"),
            "model over session": ({"adapter": "old"}, "new", "new"),
        }
        for what, (body, model, expected) in cases.items():
            session = await gateway.open_session(**body)
            async with openai.AsyncOpenAI(
                base_url=session["openai_base_url"], api_key=session["api_key"]
            ) as client:
                await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"Say something ({what})."}],
                    max_tokens=6,
                    temperature=1.0,
                )
            (turn,) = (await gateway.trace(session["session_id"]))["turns"]
            assert (turn["adapter"], turn["weight_version"]) == (expected, versions[expected]), what
            prompt, sampled = turn["prompt_ids"], turn["completion_ids"]
            ours = runs[expected].probe_logprobs(prompt + sampled, len(prompt))
            torch.testing.assert_close(
                torch.tensor(turn["completion_logprobs"]), torch.tensor(ours), atol=1e-4, rtol=0
            )
        session = await gateway.open_session(adapter="never-loaded")
        async with openai.AsyncOpenAI(
            base_url=session["openai_base_url"], api_key=session["api_key"]
        ) as client:
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
                )
        error = refused.value.body
        assert isinstance(error, dict) and error["param"] == "adapter", error
        assert "'never-loaded' is not loaded on the engines (loaded: new, old)" in error["message"]
        assert (await gateway.trace(session["session_id"]))["turns"] == []
    finally:
        await pool.close()


async def test_a_restarted_engine_server_gets_the_adapter_back(tmp_path: Path) -> None:
    """kill -9 of a launched `tracerl engine` after adapter pushes: the pool restarts it on
    its base and loads the newest adapter version again before it serves."""
    from tests.waiting import wait_until
    from tracerl.config import EngineConfig
    from tracerl.models import resolve_model
    from tracerl.rollout.backends import start_pool
    from tracerl.rollout.launcher import ProcessLauncher

    trainer = trained(1)
    config = EngineConfig(backend="local", model="tiny", device="cpu", kv_cache_tokens=2048)
    pool = await start_pool(
        config,
        resolve_model("tiny"),
        tmp_path / "logs",
        PoolConfig(health_interval_s=0.2, health_timeout_s=2.0, failure_threshold=1),
    )
    prompt = trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    probe = Probe(prompt, 1.0, TOLERANCE["float32"])
    try:
        for version in (1, 2):
            path = trainer.write_adapter(tmp_path / "adapters" / str(version))
            await pool.update_weights(None, version, adapter_files=AdapterFiles("run", str(path)))
        launcher = pool.members[0].launcher
        assert isinstance(launcher, ProcessLauncher) and launcher.process is not None
        launcher.process.kill()
        await wait_until(
            lambda: pool.counters["restarts"] == 1 and pool.members[0].active,
            "the engine restarted",
            120,
        )
        assert (await pool.members[0].engine.model_info())["adapters"] == {"run": 2}
        assert await check(pool, trainer, probe, 2) < 1e-4
    finally:
        await pool.close()


async def test_an_engine_actor_loads_adapter_packages_from_the_object_store(
    served: str,
) -> None:
    """What a Ray engine actor does with a LoRA run's package (`cluster.engine_actor`, here
    without Ray): each version written to its node in a directory of its own (the newest three
    kept) and loaded by name; the engine then samples as the trainer's adapter."""
    from tracerl.cluster.engine_actor import EngineServer
    from tracerl.cluster.weights import WeightsChannel, pack_adapter

    trainer = trained(1)
    package = pack_adapter(trainer)
    assert sorted(package.files) == ["adapter_config.json", "adapter_model.safetensors"]
    assert WeightsChannel().publish(3, None, adapter=True) == "object-store:adapter-v3"
    actor = EngineServer()
    actor.client = EngineClient(served)
    try:
        for version in (1, 2, 3, 4):
            await actor.load_adapter(package, "run", version)
        assert actor.scratch is not None
        kept = sorted(p.name for p in (actor.scratch / "adapters").iterdir())
        assert kept == ["2", "3", "4"]
        assert (await actor.client.model_info())["adapters"] == {"run": 4}
        prompt = list(range(100, 130))
        out = await actor.client.generate(
            GenerateRequest(
                input_ids=prompt,
                lora_path="run",
                sampling_params={"max_new_tokens": 6, "temperature": 1.0, "seed": 1},
            )
        )
        ours = trainer.probe_logprobs(prompt + out.output_ids, len(prompt))
        torch.testing.assert_close(
            torch.tensor(out.output_logprobs), torch.tensor(ours), atol=1e-4, rtol=0
        )
        assert out.weight_version == 4
    finally:
        await actor.stop()
    assert not actor.scratch.exists()


async def test_a_bad_adapter_push_is_a_400_naming_what_is_wrong(
    served: str, tmp_path: Path
) -> None:
    async with aiohttp.ClientSession() as http:
        for body, field in (
            ({"lora_path": "/x", "weight_version": 1}, "lora_name"),
            ({"lora_name": "a", "lora_path": "", "weight_version": 1}, "lora_path"),
            ({"lora_name": "a", "lora_path": "/x", "weight_version": "1"}, "weight_version"),
        ):
            async with http.post(served + "/load_lora_adapter", json=body) as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["field"] == field
        missing = {"lora_name": "a", "lora_path": str(tmp_path / "none"), "weight_version": 1}
        async with http.post(served + "/load_lora_adapter", json=missing) as resp:
            assert resp.status == 400
            reply = await resp.json()
        assert (
            reply["success"] is False and "adapter_config.json does not exist" in reply["message"]
        )
        trainer = trained(1)
        path = trainer.write_adapter(tmp_path / "adapter")
        config = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
        wrong = {"lora_name": "a", "lora_path": str(path), "weight_version": 1}
        async with http.post(served + "/load_lora_adapter", json=wrong) as resp:
            assert resp.status == 400
            assert "has shape" in (await resp.json())["message"]
        async with http.get(served + "/get_model_info") as resp:
            assert (await resp.json())["weight_version"] == 0  # nothing was loaded


async def test_train_against_an_attached_engine_pushes_its_adapter_alone(
    served: str, tmp_path: Path
) -> None:
    from tracerl.config import TrainCommandConfig, load_config
    from tracerl.run.loop import RLLoop

    config = load_config(
        TrainCommandConfig,
        "examples/tiny.toml",
        ["--loop.steps=2", "--logging.progress=false", "--trainer.lora.rank=4",
         f"--engine.urls=[\"{served}\"]"],
    )  # fmt: skip
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert await RLLoop(config, run_dir).run() == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "weights/probe_logprob_diff" in r]
    assert len(steps) == 2  # both pushes probed
    assert sorted(p.name for p in (run_dir / "adapters").iterdir()) == ["1", "2"]
    for record in steps:  # each step's adapter version, in a directory of its own
        pushed = run_dir / "adapters" / str(record["step"])
        assert record["weights/sync_bytes"] == sum(p.stat().st_size for p in pushed.iterdir())
    assert not (run_dir / "weights").exists()  # no merged export was written
