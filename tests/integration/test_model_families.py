"""Model families beyond the Llama layout on the embedded engine and the trainer: random two-layer
models of Gemma 2 and 3 (sliding and global layers), Qwen2-MoE, Qwen3-MoE, Mixtral, Phi-3, OLMo
2, Granite and a Mistral with a sliding window (`tests/families.py`). The engine's recorded
log-probs are the model's own (an independent full forward, its attention and window included),
the trainer's are the same, and `tracerl train` runs GRPO and PPO steps on each, its weight
probe passing after every push (a mixture of experts replaying the engine's routing)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import reference_logprobs
from tests.families import FAMILIES, WINDOW, build_family
from tracerl.config import EngineConfig
from tracerl.config.train import TrainerConfig
from tracerl.engine.generic import GenericRunner
from tracerl.engine.local import LocalEngine
from tracerl.engine.types import GenerateRequest, SamplingParams
from tracerl.train import Trainer

ROOT = Path(__file__).parents[2]
TOLERANCE = 1e-4  # float32 on both sides: rounding alone (measured below 1e-5)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: build_family(name, root / name) for name in FAMILIES}


@pytest.mark.parametrize("family", list(FAMILIES))
async def test_recorded_log_probs_are_the_models_own(
    family: str, families: dict[str, Path]
) -> None:
    """Two concurrent requests, prompts longer than the window, 24 sampled tokens each: every
    recorded log-prob equals an independent forward of the same tokens, and so does the
    trainer's (the weight probe's scoring)."""
    path = str(families[family])
    engine = LocalEngine(
        EngineConfig(model=path, device="cpu", kv_cache_tokens=4096, max_model_len=256)
    )
    # the mixtures of experts run on the slot path; none of the others fits it exactly
    assert isinstance(engine.runner, GenericRunner) != family.endswith(("moe", "mixtral"))
    trainer = Trainer(TrainerConfig(model=path, token_budget=512), device="cpu")
    prompts = [list(range(100, 100 + 3 * WINDOW)), list(range(300, 300 + 5 * WINDOW))]
    await engine.start()
    try:
        outs = await asyncio.gather(
            *(
                engine.generate(
                    GenerateRequest(
                        rid=f"{family}-{i}",
                        input_ids=prompt,
                        sampling_params=SamplingParams(
                            max_new_tokens=24, temperature=1.0, seed=i, ignore_eos=True
                        ),
                    )
                )
                for i, prompt in enumerate(prompts)
            )
        )
    finally:
        await engine.close()
    for prompt, out in zip(prompts, outs, strict=True):
        assert len(out.output_ids) == 24
        reference = reference_logprobs(engine.model, prompt, out.output_ids, 1.0)
        recorded = torch.tensor(out.output_logprobs)
        assert (recorded - reference).abs().max().item() < TOLERANCE
        scored = trainer.probe_logprobs(prompt + out.output_ids, len(prompt))
        assert (torch.tensor(scored) - reference).abs().max().item() < TOLERANCE


def test_a_window_changes_what_the_model_computes(families: dict[str, Path]) -> None:
    """The windowed families' test above can fail: on their sequences full attention gives
    other log-probs than the model's window (what the embedded engine used to compute)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(families["mistral-window"])
    ids = torch.arange(100, 100 + 4 * WINDOW)[None]
    with torch.no_grad():
        windowed = model(ids).logits
        full = AutoModelForCausalLM.from_pretrained(
            families["mistral-window"], sliding_window=None
        )(ids).logits
    assert (windowed - full).abs().max().item() > 1e-2


@pytest.mark.parametrize(
    "algorithm",
    # PPO's runs (a critic too) in `make test-slow`, to keep the default suite's time
    ["grpo", pytest.param("ppo", marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_train_runs_steps_on_the_family(
    family: str, algorithm: str, families: dict[str, Path], tmp_path: Path
) -> None:
    """`tracerl train` on the embedded engine: two steps, the probe passing after each push."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "tracerl.cli.main", "train", "examples/tiny.toml",
        "--run-dir", str(run_dir), f"--trainer.model={families[family]}",
        f"--trainer.algorithm={algorithm}", "--loop.steps=2", "--logging.progress=false",
        # float32 on any device: a GPU's default bfloat16 engine needs the probe's wider tolerance
        "--engine.dtype=float32",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["weights/probe_logprob_diff"] < 2e-4 for s in steps)
    if family.endswith(("moe", "mixtral")):  # the engine's routing replayed (all but last tokens)
        assert all(s["moe/replayed_fraction"] > 0.9 for s in steps)
    else:
        assert not any("moe/replayed_fraction" in s for s in steps)


@pytest.mark.parametrize("family", ["mistral-window", "gemma3"])
def test_a_training_step_scores_a_group_under_the_models_window(
    family: str, families: dict[str, Path]
) -> None:
    """A group's samples share their prompt, which the trainer forwards once per row under a
    tree mask (`trainer.share_prefix`); that mask would replace the model's windowed one, so a
    windowed model's step lays its samples out apart: the step's log-probs are the model's."""
    from tracerl.train import TrainSample
    from tracerl.train.batch import PackedBatch
    from tracerl.train.forward import all_logprobs

    trainer = Trainer(TrainerConfig(model=str(families[family]), token_budget=512), device="cpu")
    assert trainer.config.share_prefix and not trainer.share_prefix
    prompt = list(range(100, 100 + 4 * WINDOW))
    outputs = [list(range(500, 500 + 3 * WINDOW)), list(range(900, 900 + 2 * WINDOW))]
    samples = [
        TrainSample(prompt + out, [0] * len(prompt) + [1] * len(out),
                    [0.0] * (len(prompt) + len(out)), float(i), 0)
        for i, out in enumerate(outputs)
    ]  # fmt: skip
    batch = PackedBatch.build(samples, trainer.device)
    mbs = trainer.micro_batches(batch, [0, 1])
    scored = all_logprobs(trainer.actor, mbs, batch.token_ids.numel(), 1.0, trainer.device)
    start = 0
    for out in outputs:
        reference = reference_logprobs(trainer.actor, prompt, out, 1.0)
        got = scored[start + len(prompt) : start + len(prompt) + len(out)]
        assert (got - reference).abs().max().item() < TOLERANCE
        start += len(prompt) + len(out)
