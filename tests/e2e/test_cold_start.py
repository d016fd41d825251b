"""`[cold_start]` in `tracerl train`, on the `tiny` model: the calculator's scripted policy plays
its demonstrations through the gateway (recorded, kind `demo`), SFT trains on them in
RUN_DIR/cold_start, and RL starts from that export (the engine's weights checked by the probe);
a resumed run neither plays nor trains the cold start again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.cli.train import run_train
from tracerl.config import ConfigError, TrainCommandConfig, load_config
from tracerl.train.checkpoint import MANIFEST, latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def config(steps: int) -> TrainCommandConfig:
    return load_config(
        TrainCommandConfig,
        ROOT / "examples" / "tiny.toml",
        [
            'env={name = "calculator", max_turns = 2, sampling = {max_tokens = 24}}',
            'dataset={generate = "calculator", num_tasks = 32}',
            "cold_start.demonstrations=6",
            "cold_start.steps=2",
            "cold_start.batch_size=3",
            "cold_start.lr=1e-3",
            f"loop.steps={steps}",
            "logging.progress=false",
        ],
    )


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_cold_start_records_demonstrations_trains_on_them_and_rl_starts_from_it(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert run_train(config(steps=1), run) == 0
    demos = [e for e in lines(run / "episodes.jsonl") if e["kind"] == "demo"]
    assert len(demos) == 6 and all(e["reward"] == 1.0 for e in demos)
    sft = lines(run / "cold_start" / "metrics.jsonl")
    assert [r["step"] for r in sft] == [1, 2]
    assert all(r["perf/trained_tokens"] > 0 for r in sft)
    export = run / "cold_start" / "export"
    assert not (run / "cold_start" / "checkpoints").exists()  # exported: no longer needed
    checkpoint = latest_checkpoint(run / "checkpoints")
    assert checkpoint is not None
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    assert manifest["config"]["model"] == str(export)  # RL trained the cold start's model
    rl = [r for r in lines(run / "metrics.jsonl") if "time/step" in r]
    assert [r["step"] for r in rl] == [1]

    assert run_train(config(steps=2), run, resume=True) == 0
    assert len([e for e in lines(run / "episodes.jsonl") if e["kind"] == "demo"]) == 6
    assert len(lines(run / "cold_start" / "metrics.jsonl")) == 2  # not trained again
    rl = [r for r in lines(run / "metrics.jsonl") if "time/step" in r]
    assert [r["step"] for r in rl] == [1, 2]


def test_an_environment_without_a_scripted_policy_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    config = load_config(
        TrainCommandConfig, ROOT / "examples" / "tiny.toml", ["cold_start.demonstrations=4"]
    )  # the `concise` task: no scripted policy
    with pytest.raises(ConfigError, match="the concise environment has no scripted policy"):
        run_train(config, tmp_path)
    assert list(tmp_path.iterdir()) == []
