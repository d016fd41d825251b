"""`tracerl plot DIR`: PNG charts of a run's `metrics.jsonl` under `DIR/plots/`, or of a
`tracerl bench learn` directory (its `runs.jsonl`) as `DIR/learn_curves.png`.

One chart per theme (reward, eval accuracy, lengths, losses, KL, explained variance,
throughput, concurrency), each with the metrics of that theme that the run logged; a theme the
run has nothing for is skipped (a GRPO run has no value loss); the eval chart adds `eval.by`'s
accuracy per value. Eval accuracy is also drawn against minutes since the process started
(`eval_minutes.png`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracerl.config import ConfigError
from tracerl.run.metrics import read_metrics

CHARTS: dict[str, tuple[str, ...]] = {
    "reward": ("rollout/reward_mean", "eval/reward_mean"),
    "eval": ("eval/accuracy", "eval/pass@2", "eval/pass@4", "eval/pass@8"),
    "lengths": ("rollout/completion_tokens_mean", "rollout/sample_tokens_mean"),
    "losses": ("actor/policy_loss", "critic/value_loss", "actor/entropy"),
    "kl": ("actor/approx_kl", "kl/ref_mean", "mismatch/kl", "mismatch/logprob_abs_diff"),
    "explained_variance": ("critic/explained_variance",),
    "throughput": ("engine/generation_tokens_per_s", "rollout/tokens_per_s", "perf/tokens_per_s"),
    "concurrency": ("concurrency/cap", "concurrency/inflight"),
}


def plot_run(run_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root = Path(run_dir)
    if (root / "runs.jsonl").exists() and not (root / "metrics.jsonl").exists():
        return [plot_learn(root)]
    path = root / "metrics.jsonl"
    if not path.exists():
        raise ConfigError(f"{root}: no metrics.jsonl (is it a run directory?)")
    records = read_metrics(path)
    if not records:
        raise ConfigError(f"{path}: no metrics yet")
    out = root / "plots"
    out.mkdir(exist_ok=True)
    written = []
    for name, series in chart_series(records).items():
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, points in series.items():
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker="o", markersize=3, label=key)
        ax.set_xlabel("step")
        ax.set_title(f"{root.name}: {name.replace('_', ' ')}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        target = out / f"{name}.png"
        fig.savefig(target, dpi=100)
        plt.close(fig)
        written.append(target)
    timed = [r for r in records if "eval/accuracy" in r and "time/elapsed_s" in r]
    if timed:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([r["time/elapsed_s"] / 60 for r in timed], [r["eval/accuracy"] for r in timed],
                marker="o", label="eval/accuracy")  # fmt: skip
        ax.set_xlabel("minutes since the process started")
        ax.set_title(f"{root.name}: eval accuracy")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        target = out / "eval_minutes.png"
        fig.savefig(target, dpi=100)
        plt.close(fig)
        written.append(target)
    return written


def chart_series(
    records: list[dict[str, Any]],
) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Per chart, each metric's (step, value) points; a chart with none is left out. The eval
    chart also draws `eval.by`'s per-value accuracies (`eval/accuracy/FIELD=VALUE`)."""
    by = sorted({k for r in records for k in r if k.startswith("eval/accuracy/")})
    charts = {}
    for name, keys in CHARTS.items():
        series = {}
        for key in (*keys, *by) if name == "eval" else keys:
            points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float)]
            if points:
                series[key] = points
        if series:
            charts[name] = series
    return charts


def plot_learn(work_dir: str | Path) -> Path:
    """`tracerl bench learn`'s curves: held-out greedy accuracy against minutes from process
    start, one line per system and seed, one panel per task."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root = Path(work_dir)
    runs = [json.loads(x) for x in (root / "runs.jsonl").read_text().splitlines() if x.strip()]
    if not runs:
        raise ConfigError(f"{root / 'runs.jsonl'}: no runs yet")
    tasks = sorted({r["task"] for r in runs})
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    colours = {"tracerl-grpo": "tab:blue", "tracerl-ppo": "tab:green", "trl": "tab:orange"}
    for ax, task in zip(axes[0], tasks, strict=True):
        for run in (r for r in runs if r["task"] == task):
            points = [[0.0, run["accuracy_before"]], *run["curve"]]
            points[-1] = [points[-1][0], run["accuracy_after"]]  # the judge's final figure
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", color=colours.get(run["system"]), alpha=0.8,
                    label=f"{run['system']} seed {run['seed']}")  # fmt: skip
        ax.set_title(f"task {task}: held-out greedy accuracy")
        ax.set_xlabel("minutes")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    target = root / "learn_curves.png"
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target
