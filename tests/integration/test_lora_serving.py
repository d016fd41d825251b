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
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.actor.named_parameters():
            if ".lora_" in name:
                p.add_(0.5 * torch.randn_like(p))
    return trainer


async def test_two_runs_share_one_engine_each_sampled_by_its_own_adapter(
    served: str, tmp_path: Path
) -> None:
    runs = {name: trained(seed) for name, seed in (("run-a", 1), ("run-b", 2))}
    pools = {
        name: EnginePool([Member("shared", EngineClient(served))], PoolConfig()) for name in runs
    }
    try:
        for name, trainer in runs.items():
            path = trainer.write_adapter(tmp_path / name / "adapter")
            assert sorted(p.name for p in path.iterdir()) == [
                "adapter_config.json",
                "adapter_model.safetensors",
            ]
            await pools[name].update_weights(None, 1, adapter_files=AdapterFiles(name, str(path)))
        for name, trainer in runs.items():
            prompt = trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
            probe = Probe(prompt, 1.0, TOLERANCE["float32"])
            assert await check(pools[name], trainer, probe, 1) < 1e-4, name

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
            ours = runs[name].probe_logprobs(prompt + out.output_ids, len(prompt))
            torch.testing.assert_close(
                torch.tensor(out.output_logprobs), torch.tensor(ours), atol=1e-4, rtol=0
            )
    finally:
        for pool in pools.values():
            await pool.close()


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
    adapter_bytes = sum(p.stat().st_size for p in (run_dir / "adapter").iterdir())
    assert all(r["weights/sync_bytes"] == adapter_bytes for r in steps)
    assert not (run_dir / "weights").exists()  # no merged export was written
