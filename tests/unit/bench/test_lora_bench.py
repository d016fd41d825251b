"""`tracerl bench lora`: the configs it runs and how its summary reads the targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracerl.bench.lora import earlier_full_runs, lora_section, run_config, summarise
from tracerl.config import TrainCommandConfig, load_config


def test_the_lora_run_is_bench_learns_config_with_adapters(tmp_path: Path) -> None:
    path = tmp_path / "lora.toml"
    path.write_text(run_config(tmp_path, 1, 15, lora_section(16), 'urls = ["http://127.0.0.1:9"]'))
    config = load_config(TrainCommandConfig, path, ["--trainer.actor.lr=5e-05"])
    assert config.trainer.lora is not None and config.trainer.lora.rank == 16
    assert config.trainer.actor.lr == 5e-5 and config.trainer.seed == 1
    assert config.orchestrator.batch_size == 32 and config.loop.max_minutes == 15
    assert config.engine.urls == ["http://127.0.0.1:9"] and config.eval.every == 0
    full = tmp_path / "full.toml"
    full.write_text(run_config(tmp_path, 0, 15, ""))
    assert load_config(TrainCommandConfig, full).trainer.lora is None


def run(steps: int, step_s: float, sync_bytes: float, accuracy: float | None) -> dict[str, Any]:
    return {
        "steps": steps, "step_s_median": step_s, "sync_bytes_median": sync_bytes,
        "sync_s_median": 1.0, "rss_peak_gib": 4.0, "accuracy_after": accuracy,
    }  # fmt: skip


def test_the_summary_checks_each_target() -> None:
    full, lora = [run(90, 10.0, 540e6, 0.70)], [run(95, 9.5, 20e6, 0.675)]
    alone = run(100, 9.0, 20e6, None)
    summary = summarise(full, lora, alone, [run(41, 18, 20e6, None), run(40, 18, 20e6, None)])
    assert summary["targets"] == {
        "sync_bytes_le_5pct": True,  # 3.7 %
        "step_time_le_full": True,
        "accuracy_within_3_points": True,  # -2.5
        "shared_ge_0.8x_half_alone": True,  # 0.82x, 0.80x
    }
    assert summary["target_met"] is True
    slower = summarise(full, [run(80, 10.5, 30e6, 0.66)], alone, [run(39, 18, 20e6, None)])
    assert slower["targets"] == {
        "sync_bytes_le_5pct": False,  # 5.6 %
        "step_time_le_full": False,
        "accuracy_within_3_points": False,  # -4
        "shared_ge_0.8x_half_alone": False,  # 0.78x
    }
    assert summarise(full, lora, None, [])["targets"].keys() == {
        "sync_bytes_le_5pct", "step_time_le_full", "accuracy_within_3_points"
    }  # fmt: skip


def test_with_several_seeds_the_targets_read_the_means_of_the_pairs() -> None:
    full = [run(90, 10.0, 540e6, 0.70), run(100, 8.0, 540e6, 0.60)]
    lora = [run(95, 9.5, 20e6, 0.64), run(90, 9.0, 20e6, 0.65)]  # -6 then +5 points
    summary = summarise(full, lora, None, [])
    assert summary["seeds"] == 2
    assert summary["accuracy_delta_points_by_seed"] == pytest.approx([-6.0, 5.0])
    assert summary["accuracy_delta_points"] == pytest.approx(-0.5)
    assert summary["step_s_ratio"] == pytest.approx(18.5 / 18.0)  # mean step against mean step
    assert summary["targets"]["accuracy_within_3_points"] is True
    assert summary["targets"]["step_time_le_full"] is False


def test_full_runs_are_taken_from_an_earlier_work_dir_only_when_comparable(tmp_path: Path) -> None:
    earlier, now = tmp_path / "earlier", tmp_path / "now" / "hard"
    (earlier / "hard").mkdir(parents=True)
    now.mkdir(parents=True)
    for task_dir in (earlier / "hard", now):
        (task_dir / "heldout.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    (earlier / "hard" / "full.toml").write_text(run_config(earlier / "hard", 0, 15, ""))
    lines = [
        {**run(90, 10.0, 540e6, 0.70), "system": "full", "seed": 0},
        {**run(95, 9.5, 20e6, 0.64), "system": "lora", "seed": 0},
        {**run(92, 9.8, 540e6, 0.66), "system": "full", "seed": 1},
    ]
    (earlier / "runs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    full = earlier_full_runs(earlier, now, 2, 15)
    assert [(x["system"], x["seed"], x["accuracy_after"]) for x in full] == [
        ("full", 0, 0.70), ("full", 1, 0.66)
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"no full run for seed\(s\) \[2\]"):
        earlier_full_runs(earlier, now, 3, 15)
    with pytest.raises(ValueError, match="its runs had 15.0 minutes, this one 5"):
        earlier_full_runs(earlier, now, 2, 5)
    (now / "heldout.jsonl").write_text('{"prompt": "2+2", "answer": "4"}\n')
    with pytest.raises(ValueError, match="held-out prompts differ"):
        earlier_full_runs(earlier, now, 2, 15)
