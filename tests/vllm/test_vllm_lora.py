"""LoRA on a real vLLM server (vLLM's CPU build, launched with `engine.lora_rank`): adapter
pushes through vLLM's LoRA API pass the weight probe (vLLM samples as the trainer's adapted
actor), each version under its own name, an older adapter fails the probe, and `tracerl train`
with `[trainer.lora]` pushes the adapter alone every step and records which adapter and
version sampled each turn."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.conftest import move_adapters
from tests.vllm.conftest import PYTHON, ROOT, vllm_config
from tracerl.config import PoolConfig
from tracerl.engine.adapters import AdapterFiles
from tracerl.engine.vllm import VLLMClient
from tracerl.models import resolve_model
from tracerl.rollout.backends import start_pool
from tracerl.rollout.pool import EnginePool

pytestmark = pytest.mark.vllm


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lora_pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EnginePool]:
    logs = tmp_path_factory.mktemp("vllm-lora-logs")
    pool = await start_pool(
        vllm_config(lora_rank=4),
        resolve_model("smollm2-135m"),
        logs,
        PoolConfig(health_interval_s=0.5, request_timeout_s=120, no_engine_wait_s=600),
    )
    yield pool
    await pool.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_adapter_pushes_pass_the_probe_on_vllm_and_an_older_one_fails(
    lora_pool: EnginePool, tmp_path: Path
) -> None:
    from tracerl.config.train import TrainerConfig
    from tracerl.run.probe import PROBE_TEXT, TOLERANCE, Probe, WeightProbeError, check
    from tracerl.train import Trainer

    trainer = Trainer(TrainerConfig(model="smollm2-135m", lora={"rank": 4}), device="cpu")
    prompt = trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    probe = Probe(prompt, 1.0, TOLERANCE["float32"])

    def push(version: int) -> AdapterFiles:
        path = trainer.write_adapter(tmp_path / "adapters" / str(version))
        return AdapterFiles("run", str(path))

    move_adapters(trainer.actor, 1, 0.05)
    with pytest.raises(WeightProbeError):  # vLLM still serves the base alone
        await check(lora_pool, trainer, probe, 0)
    first = push(1)
    diffs = []
    for version in (1, 2, 3):
        if version > 1:
            move_adapters(trainer.actor, version, 0.05)
        await lora_pool.update_weights(None, version, adapter_files=push(version))
        diffs.append(await check(lora_pool, trainer, probe, version))
    assert max(diffs) < probe.tolerance, diffs
    client = lora_pool.members[0].engine
    assert isinstance(client, VLLMClient)
    assert client.served.versions == {"run": [2, 3]}  # version 1 unloaded
    assert (await lora_pool.model_info())["adapters"] == {"run": 3}
    # the same version again (an attached server, a resumed run): replaced, not refused
    await client.load_lora_adapter("run", str(tmp_path / "adapters" / "3"), 3)
    assert await check(lora_pool, trainer, probe, 3) < probe.tolerance
    await lora_pool.update_weights(None, 4, adapter_files=first)  # an older adapter
    with pytest.raises(WeightProbeError):
        await check(lora_pool, trainer, probe, 4)


def test_train_with_lora_on_vllm_pushes_the_adapter_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "tracerl.cli.main", "train", "examples/quickstart-vllm.toml",
        "--run-dir", str(run_dir), "--loop.steps=2", "--eval.every=0",
        "--logging.progress=false", f"--engine.python={PYTHON}", "--trainer.lora.rank=4",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(0 <= s["weights/probe_logprob_diff"] < 2e-4 for s in steps), steps
    for s in steps:  # the adapter alone: a few MB against the model's 540
        pushed = run_dir / "adapters" / str(s["step"])
        assert s["weights/sync_bytes"] == sum(p.stat().st_size for p in pushed.iterdir())
        assert s["weights/sync_bytes"] < 0.05 * 540e6
    assert not (run_dir / "weights").exists()  # no merged export
    log = (run_dir / "logs" / "engine-0.log").read_text()
    assert "Loaded new LoRA adapter: name 'run-v2'" in log
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        turns = [json.loads(data) for (data,) in db.execute("SELECT data FROM turns")]
    labels = {(t["adapter"], t["weight_version"]) for t in turns}
    assert (None, 0) in labels and ("run", 1) in labels, labels  # the base, then the adapter
