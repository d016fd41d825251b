"""metrics.jsonl, its truncation on resume, TensorBoard events and `tracerl plot`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.config import ConfigError, LoggingConfig
from tracerl.run.metrics import MetricsLog, read_metrics, truncate_metrics
from tracerl.run.plot import chart_series, plot_run


def write_run(run_dir: Path, steps: int) -> None:
    log = MetricsLog(run_dir, LoggingConfig(progress=False, tensorboard=True), {})
    for step in range(1, steps + 1):
        log.log(
            {
                "step": step,
                "rollout/reward_mean": 0.5 + 0.1 * step,
                "actor/policy_loss": float("nan") if step == 2 else -0.1,
                "concurrency/cap": 16,
            }
        )
    log.close()


def test_metrics_are_json_lines_and_tensorboard_events(tmp_path: Path) -> None:
    write_run(tmp_path, 3)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[1]["actor/policy_loss"] is None  # NaN is not JSON: logged as null
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_resume_truncates_later_and_torn_lines(tmp_path: Path) -> None:
    write_run(tmp_path, 4)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "rollout/rew')  # a kill mid-write
    assert truncate_metrics(tmp_path / "metrics.jsonl", last_step=2) == 3
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_plot_writes_one_chart_per_logged_theme(tmp_path: Path) -> None:
    write_run(tmp_path, 3)
    written = {p.name for p in plot_run(tmp_path)}
    assert written == {"reward.png", "losses.png", "concurrency.png"}
    for name in written:
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ConfigError, match="metrics.jsonl"):
        plot_run(tmp_path / "nothing-here")


def test_the_eval_chart_draws_each_value_of_eval_by(tmp_path: Path) -> None:
    def evaluation(step: int, whole: float, depth1: float) -> dict[str, float]:
        return {"step": step, "eval/accuracy": whole, "eval/accuracy/depth=1": depth1,
                "eval/accuracy/depth=2": 0}  # fmt: skip

    records = [evaluation(0, 0.2, 0.5), {"step": 5, "rollout/reward_mean": 0.1},
               evaluation(10, 0.4, 1.0)]  # fmt: skip
    charts = chart_series(records)
    assert set(charts) == {"eval", "reward"}
    assert charts["eval"] == {
        "eval/accuracy": [(0, 0.2), (10, 0.4)],
        "eval/accuracy/depth=1": [(0, 0.5), (10, 1.0)],
        "eval/accuracy/depth=2": [(0, 0), (10, 0)],
    }
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "eval.png" in {p.name for p in plot_run(tmp_path)}


def test_plot_cli(tmp_path: Path) -> None:
    from tracerl.cli.main import main

    write_run(tmp_path, 2)
    assert main(["plot", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1
    assert (tmp_path / "plots" / "reward.png").exists()
