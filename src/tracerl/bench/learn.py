"""`tracerl bench learn`: how much each system learns in the same wall-clock budget.

For each task (`hard`: base greedy accuracy <= 2 %, `medium`: 5-30 %; `learn_tasks`) and seed,
every system trains SmolLM2-135M-Instruct on the same train prompts with the same reward, batch
(4 prompts x 8 samples), learning rate (constant), sampling (`--temperature`, default 1; 12
new tokens) and budget (`--minutes`, from its process's start: imports and model loading are
charged):

- `tracerl-grpo`, `tracerl-ppo`: `tracerl train` on a generated config, as a user runs it, with
  `loop.max_minutes` as the budget, no eval of its own and a snapshot of the actor's weights
  every `--eval-every` steps (`loop.snapshot_every`: their writes, ~1 s each, charged to the
  budget and left out of the curve's minutes, as TRL's snapshots are); `tracerl
  train` overrides given to the command (`--trainer.autocast=bfloat16`) apply to these runs,
  and each run's line records them;
- `trl`: TRL's `GRPOTrainer` (`learn_trl`, loss `dapo`, beta 0), its periodic evals not charged.

The judge is one function for all: greedy accuracy on 200 held-out prompts (disjoint from the
train prompts) with plain HF `generate`, on the base model (before), in TRL's process on its
weights every third of the budget and at the end (its time left out of TRL's budget), and
after each tracerl run on every snapshot it wrote (its curve; the last is its score): no
system's evals are charged. One JSON line per run, then the summary: per system and task,
mean / worst / best accuracy after and steps; the ratios against TRL; on each seed the minutes
tracerl took to reach TRL's final accuracy; the targets and `target_met`. The curves
(held-out accuracy against minutes) are drawn to `WORK_DIR/learn_curves.png` (as `tracerl
plot WORK_DIR` draws them). `--first-seed N` runs seeds N.. (a later seed alone), and
`--include WORK_DIR` adds an earlier run's `runs.jsonl` to the summary: the same budget and
settings are the caller's to keep; a run that would be counted twice is refused. `--seeds 0`
runs nothing: it pools the `--include` runs into WORK_DIR (their lines and curves) and prints
their summary, for seeds that separate commands ran. On the
agentic tasks, `--start-from WORK_DIR` reuses that run's start checkpoint and task files
(`learn_agents`), so a later seed starts where the earlier ones did.

Targets, on each task over the seeds run (issue 12): tracerl-grpo's mean >= 1.3x TRL's mean,
its worst seed >= TRL's worst, its steps >= 1.5x TRL's; tracerl-ppo's mean >= TRL's mean; and
(issue 29) tracerl-grpo reaching TRL's final accuracy within half the budget on every seed. It
needs the `bench` extra (`trl`); nothing in the package imports TRL otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from tracerl.bench import learn_agents
from tracerl.bench.learn_config import train_config
from tracerl.bench.learn_tasks import DEFAULT_HELDOUT, DEFAULT_MAX_NEW_TOKENS, split_tasks
from tracerl.envs.dataset import read_jsonl
from tracerl.run.plot import plot_learn

SYSTEMS = ("tracerl-grpo", "tracerl-ppo", "trl")
TASKS = ("hard", "medium")
# Enough train prompts that no run reaches the end of an epoch within 15 minutes.
TRAIN_PROMPTS = 5000
# What one run may take beyond its budget (its final eval, the judge, a slow exit) before the
# benchmark gives up on it.
OVERRUN_S = 900.0
LR = 5e-6
PROMPTS_PER_STEP, GROUP_SIZE = 4, 8


def tracerl_config(
    algorithm: str,
    train: Path,
    heldout: Path,
    seed: int,
    minutes: float,
    snapshot_every: int | None = None,
    engine: str = "",
) -> str:
    """The `tracerl train` config of one run: the issue's settings, nothing tuned per task; no
    eval of its own; a snapshot every `snapshot_every` steps and at the end for the judge
    (None: none); `engine`: extra `[engine]` lines (another backend)."""
    return train_config(
        model="smollm2-135m", algorithm=algorithm, seed=seed, lr=LR, token_budget=4096,
        env='name = "arithmetic"', max_tokens=DEFAULT_MAX_NEW_TOKENS, train=train,
        heldout=heldout, batch_size=PROMPTS_PER_STEP * GROUP_SIZE, group_size=GROUP_SIZE,
        steps=100000, minutes=minutes, eval_every=0,
        snapshot_every=snapshot_every,
        engine=f"kv_cache_tokens = 16384\nmax_running_requests = 64\nmax_model_len = 512\n{engine}",
    )  # fmt: skip


def run_tracerl(
    algorithm: str,
    task_dir: Path,
    seed: int,
    minutes: float,
    snapshot_every: int,
    overrides: list[str],
    vllm_python: str | None = None,
) -> dict[str, Any]:
    """One `tracerl train` process with the config `overrides`; its steps, and the judge on
    every snapshot it wrote, after it (its curve; the last one is its score). With
    `vllm_python`, vLLM generates (the system is then `tracerl-ALGORITHM-vllm`)."""
    system = f"tracerl-{algorithm}" + ("-vllm" if vllm_python else "")
    run_dir = task_dir / f"{system}-seed{seed}"
    config = task_dir / f"{system}-seed{seed}.toml"
    engine = f'backend = "vllm"\npython = "{vllm_python}"' if vllm_python else ""
    config.write_text(
        tracerl_config(
            algorithm, (task_dir / "train.jsonl").resolve(),
            (task_dir / "heldout.jsonl").resolve(), seed, minutes, snapshot_every, engine,
        )
    )  # fmt: skip
    return learn_agents.judged_run(
        config, run_dir, system, seed, minutes * 60 + OVERRUN_S, overrides,
        learn_agents.saved_steps, lambda step: judge_snapshot(run_dir, task_dir, step),
    )  # fmt: skip


def judge_snapshot(run_dir: Path, task_dir: Path, step: int) -> float:
    """Greedy held-out accuracy of `run_dir`'s snapshot of `step` (its actor's weights)."""
    from tracerl.bench.learn_tasks import greedy_accuracy, load_policy
    from tracerl.train.export import snapshot_path

    model, tokenizer = load_policy(str(snapshot_path(run_dir, step)))
    return greedy_accuracy(model, tokenizer, read_jsonl(task_dir / "heldout.jsonl"))


def run_trl(
    task_dir: Path, seed: int, minutes: float, eval_every_min: float, temperature: float = 1.0
) -> dict[str, Any]:
    out = task_dir / f"trl-seed{seed}"
    command = [
        sys.executable, "-m", "tracerl.bench.learn_trl",
        "--train", str(task_dir / "train.jsonl"), "--heldout", str(task_dir / "heldout.jsonl"),
        "--seed", str(seed), "--minutes", str(minutes), "--out", str(out), "--lr", str(LR),
        "--prompts-per-step", str(PROMPTS_PER_STEP), "--group-size", str(GROUP_SIZE),
        "--max-new-tokens", str(DEFAULT_MAX_NEW_TOKENS), "--eval-every-min", str(eval_every_min),
        "--temperature", str(temperature),
    ]  # fmt: skip
    # its evals are added to its deadline
    wall = learn_agents.run_logged(
        command, task_dir / f"{out.name}.log", minutes * 60 + OVERRUN_S * 2
    )
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    result["wall_s"] = wall
    return result


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_task_files(task_dir: Path, task: str) -> list[dict[str, Any]]:
    """`task_dir/train.jsonl` and `heldout.jsonl` of `task` (seed 0); returns the held-out."""
    train, heldout = split_tasks(task, TRAIN_PROMPTS, DEFAULT_HELDOUT, seed=0)
    write_jsonl(task_dir / "train.jsonl", train)
    write_jsonl(task_dir / "heldout.jsonl", heldout)
    return heldout


def summarise(runs: list[dict[str, Any]], tasks: list[str], minutes: float) -> dict[str, Any]:
    """Per task and system: accuracy mean / worst / best, steps; ratios and targets vs TRL, with
    the minutes tracerl-grpo took on each seed to reach TRL's final accuracy on that seed."""
    summary: dict[str, Any] = {"tasks": {}}
    met = True
    for task in tasks:
        per: dict[str, dict[str, float]] = {}
        present = {r["system"] for r in runs if r["task"] == task}
        for system in [*SYSTEMS, *sorted(present - set(SYSTEMS))]:  # -vllm runs after the rest
            mine = [r for r in runs if r["task"] == task and r["system"] == system]
            if not mine:
                continue
            per[system] = learn_agents.seed_stats(mine, "accuracy")
        entry: dict[str, Any] = {"systems": per}
        trl, grpo, ppo = per.get("trl"), per.get("tracerl-grpo"), per.get("tracerl-ppo")
        if trl and grpo:
            ratio = grpo["accuracy_mean"] / max(trl["accuracy_mean"], 1e-9)
            steps = grpo["steps_mean"] / max(trl["steps_mean"], 1e-9)
            of_task = [r for r in runs if r["task"] == task]
            reach = learn_agents.minutes_to_trl_final(of_task, "tracerl-grpo")
            entry["grpo_vs_trl"] = {
                "accuracy_mean_ratio": ratio, "steps_ratio": steps, "minutes_to_trl_final": reach,
            }  # fmt: skip
            targets = {
                "grpo_mean_ge_1.3x_trl": ratio >= 1.3,
                "grpo_worst_ge_trl_worst": grpo["accuracy_worst"] >= trl["accuracy_worst"],
                "grpo_steps_ge_1.5x_trl": steps >= 1.5,
                "grpo_reaches_trl_final_in_half_budget": learn_agents.reached_in(
                    reach, minutes / 2
                ),
            }
            if ppo:
                targets["ppo_mean_ge_trl_mean"] = ppo["accuracy_mean"] >= trl["accuracy_mean"]
            entry["targets"] = targets
            met = met and all(targets.values())
        else:
            met = False
        summary["tasks"][task] = entry
    summary["target_met"] = met
    return summary


def read_included(
    work_dir: Path, tasks: list[str], systems: list[str] | None = None
) -> list[dict[str, Any]]:
    """An earlier `bench learn`'s runs of these tasks (of these systems only, when given), to
    summarise with this one's."""
    path = work_dir / "runs.jsonl"
    try:  # the dataset reader: errors by file:line, every row checked for what is summarised
        runs = read_jsonl(path, ("task", "system", "seed", "accuracy_after", "steps"))
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench learn: --include {work_dir}: cannot read {path}: {e}") from e
    if systems is not None:
        held = sorted({r["system"] for r in runs})
        missing = [s for s in systems if s not in held]
        if missing:
            raise SystemExit(
                f"bench learn: --include {work_dir}:{','.join(systems)}: {path} holds no runs "
                f"of {', '.join(missing)} (it holds {', '.join(held) or 'none'})"
            )
        runs = [r for r in runs if r["system"] in systems]
    return [r for r in runs if r.get("task") in tasks]


def include_spec(spec: str) -> tuple[Path, list[str] | None]:
    """`--include WORK_DIR` (all its runs) or `WORK_DIR:SYSTEM[,SYSTEM...]` (those systems')."""
    path, colon, names = spec.partition(":")
    systems = [s for s in names.split(",") if s]
    if colon and not systems:
        raise SystemExit(f"bench learn: --include {spec}: name systems after the ':' "
                         "(WORK_DIR:SYSTEM[,SYSTEM...]) or leave it out")  # fmt: skip
    return Path(path), systems or None


def check_overrides(
    overrides: list[str], included: list[dict[str, Any]], planned: set[tuple[str, str, int]]
) -> None:
    """Before any training: the `tracerl train` overrides must be ones a config takes (checked on
    a generated config), and one system's runs on a task, included or `planned`, must share
    their overrides, or the summary would pool two settings as one system's seeds."""
    if overrides:
        import tomllib

        from tracerl.config import ConfigError, TrainCommandConfig, load_config

        generated = tomllib.loads(tracerl_config("grpo", Path("t"), Path("h"), 0, 15.0, 20))
        try:
            load_config(TrainCommandConfig, None, overrides, generated)
        except ConfigError as e:
            raise SystemExit(f"bench learn: the tracerl overrides: {e}") from None
    # runs from before the overrides were recorded ran with none
    runs = [(r["task"], r["system"], r["seed"], r.get("overrides", [])) for r in included]
    runs += [(task, system, seed, overrides) for task, system, seed in sorted(planned)]
    settings: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for task, system, seed, given in runs:
        if system == "trl":  # the overrides are tracerl's
            continue
        first = settings.setdefault((task, system), (f"seed{seed}", given))
        if first[1] != given:
            raise SystemExit(
                f"bench learn: {task}/{system} ran {first[0]} with overrides {first[1]} and "
                f"seed{seed} with {given}: one system's seeds must share their settings"
            )


def sampling_overrides(temperature: float) -> list[str]:
    """The `tracerl train` overrides that make a run sample at `temperature` (none at 1, the
    generated configs' own), its log-probs taken at the same temperature."""
    if temperature == 1.0:
        return []
    return [f"trainer.temperature={temperature}", f"env.sampling.temperature={temperature}"]


def check_temperature(
    temperature: float, included: list[dict[str, Any]], planned: set[tuple[str, str, int]]
) -> None:
    """The runs started now sample at `--temperature`; in a summary each system's runs on a task
    share one temperature (runs recorded before the option sampled at 1), while two systems may
    each be at their own, as when the baseline runs at its better setting."""
    if temperature <= 0:
        raise SystemExit(f"bench learn: --temperature must be above 0, got {temperature}")
    first: dict[tuple[str, str], tuple[str, float]] = {
        (task, system): (f"seed{seed}, run now", temperature) for task, system, seed in planned
    }
    for r in included:
        at = r.get("temperature", 1.0)
        seen = first.setdefault((r["task"], r["system"]), (f"seed{r['seed']}", at))
        if seen[1] != at:
            raise SystemExit(
                f"bench learn: {r['task']}/{r['system']} sampled at temperature {seen[1]} "
                f"({seen[0]}) and at {at} (seed{r['seed']}, --include): one system's runs "
                "in a summary sample at one temperature"
            )


def main(args: argparse.Namespace) -> int:
    from tracerl.bench.learn_tasks import greedy_accuracy, load_policy

    tasks = [t for t in args.tasks.split(",") if t]
    systems = [s for s in args.systems.split(",") if s]
    seeds_run = range(args.first_seed, args.first_seed + args.seeds)
    agent_tasks = [t for t in tasks if t in learn_agents.AGENT_TASKS]
    tasks = [t for t in tasks if t not in agent_tasks]
    all_tasks = (*TASKS, *learn_agents.AGENT_TASKS)
    for name, allowed, given in (
        ("--tasks", all_tasks, tasks + agent_tasks),
        ("--systems", (*SYSTEMS, *learn_agents.SIGNAL_SYSTEMS), systems),
    ):
        unknown = sorted(set(given) - set(allowed))
        if unknown or not given:
            raise SystemExit(f"bench learn: {name} takes some of {', '.join(allowed)}")
    signal = [s for s in systems if s in learn_agents.SIGNAL_SYSTEMS]
    lacking = [t for t in tasks + agent_tasks if t not in learn_agents.DIFFICULTY_FIELDS]
    if signal and lacking:
        fields = ", ".join(f"{t}: {f}" for t, f in learn_agents.DIFFICULTY_FIELDS.items())
        raise SystemExit(
            f"bench learn: {signal[0]} needs tasks with a difficulty field ({fields}); "
            f"{', '.join(lacking)} has none"
        )
    if args.seeds < 0:
        raise SystemExit("bench learn: --seeds takes a count of seeds to run; 0 runs none and "
                         "summarises the runs given by --include")  # fmt: skip
    if "trl" in systems and args.seeds:
        try:
            import trl  # noqa: F401
        except ImportError:
            raise SystemExit("bench learn: TRL is missing: pip install -e '.[bench]'") from None
    # read before hours of training: a bad path, or a run this one repeats, fails now
    included: list[dict[str, Any]] = []
    for spec in args.include:
        work_dir, only = include_spec(spec)
        included += read_included(work_dir, tasks + agent_tasks, only)
    planned = {
        (task, system, seed)
        for task in tasks + agent_tasks
        for system in systems
        for seed in seeds_run
    }
    keys = [(r["task"], r["system"], r["seed"]) for r in included]
    repeated = sorted({k for k in keys if k in planned or keys.count(k) > 1})
    if repeated:
        raise SystemExit(
            "bench learn: --include holds runs this summary would count twice: "
            + ", ".join(f"{task}/{system}/seed{seed}" for task, system, seed in repeated)
        )
    if not args.seeds and not included:
        raise SystemExit(f"bench learn: --seeds 0 summarises earlier runs: the --include work "
                         f"dirs ({len(args.include)} given) hold no runs of "
                         f"{', '.join(tasks + agent_tasks)}")  # fmt: skip
    temperature = getattr(args, "temperature", 1.0)
    check_temperature(temperature, included, planned)
    # tracerl's runs sample at the temperature through their config; recorded with them
    sampling = sampling_overrides(temperature) if args.seeds else []
    overrides: list[str] = [*getattr(args, "overrides", []), *sampling]
    check_overrides(overrides, included, planned)
    start_from = getattr(args, "start_from", None)
    if start_from is not None:
        if not agent_tasks:
            raise SystemExit("bench learn: --start-from is for the agentic tasks "
                             f"({', '.join(learn_agents.AGENT_TASKS)})")  # fmt: skip
        start_from = Path(start_from)
        for task in agent_tasks:  # before any training
            learn_agents.earlier_start(start_from, task)
    if agent_tasks and args.backend != "local":
        raise SystemExit(
            f"bench learn: the agentic tasks ({', '.join(learn_agents.AGENT_TASKS)}) run "
            "--backend local"
        )
    vllm_python = None
    if args.backend == "vllm":
        from tracerl.bench.engine_vllm import _vllm_python

        # absolute, not resolved: a venv's python is a symlink whose target has no vLLM
        vllm_python = os.path.abspath(_vllm_python(args.engine_python))
    work = Path(args.work_dir or f"runs/bench-learn-{time.strftime('%Y%m%d-%H%M%S')}")
    work.mkdir(parents=True, exist_ok=False)
    if not args.seeds:  # a summary of earlier runs only: WORK_DIR holds them, pooled, and plots
        write_jsonl(work / "runs.jsonl", included)
        plot_learn(work)
        return report(args, work, tasks, agent_tasks, included, [], overrides, start_from)
    runs = []
    for task in tasks:
        task_dir = work / task
        task_dir.mkdir()
        heldout = write_task_files(task_dir, task)
        model, tokenizer = load_policy()
        before = greedy_accuracy(model, tokenizer, heldout)
        del model
        print(json.dumps({"task": task, "accuracy_before": before}), flush=True)
        for seed in seeds_run:
            for system in systems:
                if system == "trl":
                    result = run_trl(task_dir, seed, args.minutes, args.minutes / 3, temperature)
                else:
                    algorithm = system.removeprefix("tracerl-")
                    result = run_tracerl(
                        algorithm, task_dir, seed, args.minutes, args.eval_every, overrides,
                        vllm_python,
                    )  # fmt: skip
                result.update(task=task, accuracy_before=before, temperature=temperature)
                runs.append(result)
                print(json.dumps(result), flush=True)
                write_jsonl(work / "runs.jsonl", runs)
    for task in agent_tasks:
        runs += learn_agents.run_task(
            task, work, systems, seeds_run, args.minutes, args.agent_checkpoint_every,
            overrides, start_from, temperature,
        )  # fmt: skip
    write_jsonl(work / "runs.jsonl", runs)
    plot_learn(work)
    return report(args, work, tasks, agent_tasks, included, runs, overrides, start_from)


def report(
    args: argparse.Namespace,
    work: Path,
    tasks: list[str],
    agent_tasks: list[str],
    included: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    overrides: list[str],
    start_from: Path | None,
) -> int:
    """Print the summary line over the included and the new runs (each summary takes its own
    tasks' runs)."""
    summary: dict[str, Any] = {"tasks": {}, "target_met": True}
    if tasks:
        summary = summarise(included + runs, tasks, args.minutes)
    if agent_tasks:
        agents = learn_agents.summarise(included + runs, agent_tasks, args.minutes)
        summary["tasks"].update(agents["tasks"])
        summary["target_met"] = summary["target_met"] and agents["target_met"]
    seeds = sorted({(r["task"], r["system"], r["seed"]) for r in included + runs})
    summary.update(
        minutes=args.minutes, seeds=args.seeds, work_dir=str(work), included=args.include,
        runs_summarised=[f"{task}/{system}/seed{seed}" for task, system, seed in seeds],
        overrides=overrides, start_from=None if start_from is None else str(start_from),
        # the runs started now (each system's own is in its stats): none for a summary alone
        temperature=getattr(args, "temperature", 1.0) if args.seeds else None,
        machine=machine() if args.seeds else None,
    )  # fmt: skip
    print(json.dumps(summary), flush=True)
    return 0


def machine() -> dict[str, Any]:
    """The CPU the runs started now ran on: step times and budgets compare only on one machine
    (a CPU without bf16 arithmetic ran these benchmarks 3-10x slower than one with it)."""
    from tracerl.bench.learn_trl import native_bf16

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), None)
    return {"cpu": name or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "native_bf16": native_bf16()}  # fmt: skip
