"""`tracerl plot RUN_DIR`: PNG charts of a run's `metrics.jsonl` under `RUN_DIR/plots/`.

One chart per theme (reward, lengths, losses, KL, explained variance, throughput, concurrency),
each with the metrics of that theme that the run logged; a theme the run has nothing for is
skipped (a GRPO run has no value loss).
"""

from __future__ import annotations

from pathlib import Path

from tracerl.config import ConfigError
from tracerl.run.metrics import read_metrics

CHARTS: dict[str, tuple[str, ...]] = {
    "reward": ("rollout/reward_mean", "eval/reward_mean"),
    "lengths": ("rollout/completion_tokens_mean", "rollout/sample_tokens_mean"),
    "losses": ("actor/policy_loss", "critic/value_loss", "actor/entropy"),
    "kl": ("actor/approx_kl", "kl/ref_mean", "mismatch/kl", "mismatch/logprob_abs_diff"),
    "explained_variance": ("critic/explained_variance",),
    "throughput": ("rollout/tokens_per_s", "perf/tokens_per_s"),
    "concurrency": ("concurrency/cap", "concurrency/inflight"),
}


def plot_run(run_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root = Path(run_dir)
    path = root / "metrics.jsonl"
    if not path.exists():
        raise ConfigError(f"{root}: no metrics.jsonl (is it a run directory?)")
    records = read_metrics(path)
    if not records:
        raise ConfigError(f"{path}: no metrics yet")
    out = root / "plots"
    out.mkdir(exist_ok=True)
    written = []
    for name, keys in CHARTS.items():
        series = {}
        for key in keys:
            points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float)]
            if points:
                series[key] = points
        if not series:
            continue
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
    return written
