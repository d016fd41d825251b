"""`tracerl bench lora`: LoRA against full fine-tuning on `tracerl bench learn`'s `hard` task.

Every run is `tracerl train` on the config `bench learn` generates (SmolLM2-135M-Instruct, 4
prompts x 8 samples, 12 new tokens, temperature 1, constant lr, seed 0), for `--minutes` from
its process's start, one after another on the otherwise idle machine:

- `full`: every weight trained, at `bench learn`'s lr (5e-6); the embedded engine takes the
  whole model in process after each step.
- `lora`: `[trainer.lora]` of rank `--rank` on every linear layer, at `--lora-lr`; the embedded
  engine takes the adapter alone.
- `--seeds N`: the pair for seeds 0..N-1 (one figure's standard error on 200 held-out prompts
  is ~3.4 points, more than the accuracy target's 3: one pair cannot settle it).
- `--full-from DIR`: the `full` runs are read from an earlier `bench lora` work directory
  (its `runs.jsonl`, same budget, same held-out prompts, every seed) instead of run again, so
  a LoRA setting can be tried against full runs already measured. Its time ratios compare
  runs made at different times: they hold only if both ran on the otherwise idle machine.
- `alone` and `shared` (not with `--quick` or `--no-shared`): one `tracerl engine` server
  (the embedded engine in a process of its own) and LoRA runs attached to it (`engine.urls`):
  one run alone, then two at once (seeds 0 and 1), each pushing and sampled by its own adapter.

From each run's `metrics.jsonl`: steps, median step and train time, median weight-sync bytes
and seconds, peak RSS of the run's process, the optimizer's state; then one judge for all,
greedy accuracy on the held-out prompts (200; `--quick`: 50) of the run's final weights (its
`tracerl export`: merged for LoRA). One JSON line per run, then the summary.

Targets (issue 30), over the seeds' means: LoRA's sync bytes <= 5 % of full's; its median step
time <= full's; its held-out accuracy >= full's - 3 points; each shared run's steps >= 0.8x
half the alone run's ("alone at half the engine": on this CPU the engine and the trainers share
two cores, so a run that had half the machine would take about half the alone run's steps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tracerl.bench import learn, learn_agents
from tracerl.envs.dataset import read_jsonl
from tracerl.run.metrics import read_metrics

TASK = "hard"
RANK, LORA_LR = 16, 1e-4
QUICK_MINUTES, QUICK_HELDOUT = 1.5, 50


def run_config(task_dir: Path, seed: int, minutes: float, lora: str, engine: str = "") -> str:
    """`bench learn`'s config of one `hard` run (its lr is given on the command line), with
    `lora`, the `[trainer.lora]` section, and more `engine` lines for `[engine]`."""
    text = learn.tracerl_config(
        "grpo", (task_dir / "train.jsonl").resolve(), (task_dir / "heldout.jsonl").resolve(),
        seed, minutes, engine=engine,
    )  # fmt: skip
    return text + lora


def lora_section(rank: int) -> str:
    return f"\n[trainer.lora]\nrank = {rank}\n"


def train(task_dir: Path, name: str, config: str, minutes: float, *extra: str) -> Path:
    """One `tracerl train` run in `task_dir/name`; its run directory."""
    path = task_dir / f"{name}.toml"
    path.write_text(config)
    run_dir = task_dir / name
    learn_agents.train(path, run_dir, minutes * 60 + learn.OVERRUN_S, *extra)
    return run_dir


def judge(run_dir: Path, heldout: list[dict[str, Any]]) -> float:
    """Greedy held-out accuracy of the run's final weights, through `tracerl export`."""
    from tracerl.bench.learn_tasks import greedy_accuracy, load_policy
    from tracerl.cli.main import main as cli

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model"
        if cli(["export", str(run_dir), str(out)]) != 0:
            raise RuntimeError(f"tracerl export {run_dir} failed")
        model, tokenizer = load_policy(str(out))
        return greedy_accuracy(model, tokenizer, heldout)


def measured(run_dir: Path, system: str, heldout: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A finished run's line: its steps and medians, memory, and (with `heldout`) the judge."""
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if "time/step_s" in r]
    if not steps:
        raise RuntimeError(f"{run_dir}: no step finished")

    def median(key: str) -> float:
        return float(statistics.median(r[key] for r in steps))

    return {
        "system": system,
        "run": run_dir.name,
        "steps": len(steps),
        "step_s_median": median("time/step_s"),
        "train_s_median": median("time/train_s"),
        "sync_bytes_median": median("weights/sync_bytes"),
        "sync_s_median": median("time/weight_sync_s"),
        "rss_peak_gib": max(r["memory/rss_peak_gib"] for r in steps),
        "optimizer_gib": steps[-1].get("memory/optimizer_gib"),
        "accuracy_after": judge(run_dir, heldout) if heldout is not None else None,
    }


def earlier_full_runs(
    work: Path, task_dir: Path, seeds: int, minutes: float
) -> list[dict[str, Any]]:
    """The `full` lines of the `bench lora` run in `work`, seeds 0..seeds-1, checked to be
    comparable with this run: the same budget and the same held-out prompts."""
    from tracerl.config import TrainCommandConfig, load_config

    earlier = work / TASK
    lines = read_jsonl(work / "runs.jsonl")
    full = {line["seed"]: line for line in lines if line.get("system") == "full"}
    missing = [seed for seed in range(seeds) if seed not in full]
    if missing:
        raise ValueError(f"--full-from {work}: no full run for seed(s) {missing}")
    budget = load_config(TrainCommandConfig, earlier / "full.toml").loop.max_minutes
    if budget != minutes:
        raise ValueError(f"--full-from {work}: its runs had {budget} minutes, this one {minutes}")
    if (earlier / "heldout.jsonl").read_bytes() != (task_dir / "heldout.jsonl").read_bytes():
        raise ValueError(f"--full-from {work}: its held-out prompts differ from this run's")
    return [full[seed] for seed in range(seeds)]


def shared_engine(
    task_dir: Path, minutes: float, lora: str, lr: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One LoRA run alone on a `tracerl engine` server, then two at once on a fresh one."""
    from tracerl.config import EngineConfig
    from tracerl.engine.client import EngineClient
    from tracerl.models import resolve_model
    from tracerl.rollout.backends import process_launcher

    config = EngineConfig(
        model="smollm2-135m", kv_cache_tokens=16384, max_running_requests=64, max_model_len=512
    )

    async def attached(seeds: list[int], label: str) -> list[Path]:
        # one event loop throughout: it drains the server's output while the runs go
        launcher = process_launcher(
            config, resolve_model(config.model), task_dir / f"engine-{label}.log",
            f"engine-{label}", EngineClient,
        )  # fmt: skip
        url = await launcher.start()
        engine = f'urls = ["{url}"]'
        try:
            flag = f"--trainer.actor.lr={lr}"
            configs = {s: run_config(task_dir, s, minutes, lora, engine) for s in seeds}
            runs = [
                asyncio.to_thread(train, task_dir, f"lora-{label}-seed{s}", c, minutes, flag)
                for s, c in configs.items()
            ]
            return list(await asyncio.gather(*runs))
        finally:
            await launcher.stop()

    (alone,) = asyncio.run(attached([0], "alone"))
    shared = asyncio.run(attached([0, 1], "shared"))
    return measured(alone, "alone", None), [measured(r, "shared", None) for r in shared]


def summarise(
    full: list[dict[str, Any]],
    lora: list[dict[str, Any]],
    alone: dict[str, Any] | None,
    shared: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ratios of LoRA's runs to full's (means over the seeds' pairs) and the targets."""

    def ratio(key: str) -> float:
        return statistics.mean(r[key] for r in lora) / statistics.mean(r[key] for r in full)

    pairs = zip(full, lora, strict=True)
    deltas = [100 * (b["accuracy_after"] - a["accuracy_after"]) for a, b in pairs]
    summary: dict[str, Any] = {
        "seeds": len(full),
        "sync_bytes_ratio": ratio("sync_bytes_median"),
        "sync_s_ratio": ratio("sync_s_median"),
        "step_s_ratio": ratio("step_s_median"),
        "steps_ratio": ratio("steps"),
        "rss_peak_ratio": ratio("rss_peak_gib"),
        "accuracy_full": statistics.mean(r["accuracy_after"] for r in full),
        "accuracy_lora": statistics.mean(r["accuracy_after"] for r in lora),
        "accuracy_delta_points": statistics.mean(deltas),
        "accuracy_delta_points_by_seed": deltas,
    }
    targets = {
        "sync_bytes_le_5pct": summary["sync_bytes_ratio"] <= 0.05,
        "step_time_le_full": summary["step_s_ratio"] <= 1.0,
        "accuracy_within_3_points": summary["accuracy_delta_points"] >= -3.0,
    }
    if alone is not None and shared:
        half = alone["steps"] / 2
        summary["shared_steps_over_half_alone"] = [r["steps"] / half for r in shared]
        targets["shared_ge_0.8x_half_alone"] = all(
            r >= 0.8 for r in summary["shared_steps_over_half_alone"]
        )
    summary["targets"] = targets
    summary["target_met"] = all(targets.values())
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracerl bench lora", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1.5-minute runs, no shared engine")
    parser.add_argument("--minutes", type=float, default=15.0, help="budget of each run")
    parser.add_argument("--rank", type=int, default=RANK, help="LoRA rank")
    parser.add_argument("--lora-lr", type=float, default=LORA_LR, help="LoRA's learning rate")
    parser.add_argument(
        "--seeds", type=int, default=1,
        help="full and LoRA runs for seeds 0..N-1; the accuracy target reads their means",
    )  # fmt: skip
    parser.add_argument(
        "--no-shared", action="store_true", help="skip the runs on an engine server"
    )
    parser.add_argument(
        "--full-from", metavar="DIR", help="take the full runs from an earlier work directory"
    )
    parser.add_argument("--work-dir", help="where runs go (default runs/bench-lora-TIME)")
    args = parser.parse_args(argv)
    minutes = QUICK_MINUTES if args.quick else args.minutes
    work = Path(args.work_dir or f"runs/bench-lora-{time.strftime('%Y%m%d-%H%M%S')}")
    task_dir = work / TASK
    task_dir.mkdir(parents=True, exist_ok=False)
    learn.write_task_files(task_dir, TASK)
    heldout = read_jsonl(task_dir / "heldout.jsonl")[: QUICK_HELDOUT if args.quick else None]
    lora = lora_section(args.rank)
    lines: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {"full": [], "lora": []}
    systems = [("full", "", learn.LR), ("lora", lora, args.lora_lr)]
    if args.full_from:
        runs["full"] = earlier_full_runs(Path(args.full_from), task_dir, args.seeds, minutes)
        lines.extend(runs["full"])
        systems = systems[1:]
    for seed in range(args.seeds):  # each seed's pair one after the other
        for system, extra, lr in systems:
            config = run_config(task_dir, seed, minutes, extra)
            name = system + (f"-seed{seed}" if seed else "")
            run_dir = train(task_dir, name, config, minutes, f"--trainer.actor.lr={lr}")
            line = {**measured(run_dir, system, heldout), "seed": seed}
            runs[system].append(line)
            lines.append(line)
            print(json.dumps(line), flush=True)
    alone: dict[str, Any] | None = None
    shared: list[dict[str, Any]] = []
    if not (args.quick or args.no_shared):
        alone, shared = shared_engine(task_dir, minutes, lora, args.lora_lr)
        for line in (alone, *shared):
            lines.append(line)
            print(json.dumps(line), flush=True)
    learn.write_jsonl(work / "runs.jsonl", lines)
    settings: dict[str, Any] = {
        "minutes": minutes,
        "rank": args.rank,
        "lora_lr": args.lora_lr,
        "full_lr": learn.LR,
    }
    if args.full_from:
        settings["full_from"] = args.full_from
    summary = summarise(runs["full"], runs["lora"], alone, shared)
    print(json.dumps({"bench": "lora", **settings, **summary}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
