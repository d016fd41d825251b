"""`tracerl bench learn`: its tasks, the configs it runs, and how it judges the runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tracerl.bench.learn import summarise, tracerl_config
from tracerl.bench.learn_tasks import LEARN_TASKS, split_tasks
from tracerl.config import TrainCommandConfig, load_config


@pytest.mark.parametrize("task", sorted(LEARN_TASKS))
def test_held_out_prompts_never_appear_in_train(task: str) -> None:
    train, heldout = split_tasks(task, 2000, 200, seed=0)
    assert len(heldout) == 200 and len({t["prompt"] for t in heldout}) == 200
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in heldout}
    assert split_tasks(task, 2000, 200, seed=0) == (train, heldout)  # the same on every run
    for t in train[:20]:
        a, b = (int(x) for x in t["prompt"].removeprefix("Compute the sum of ").split(".")[0]
                .split(" and "))  # fmt: skip
        assert t["answer"] == a + b


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_the_generated_tracerl_config_is_the_issue_s_settings(
    tmp_path: Path, algorithm: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        tracerl_config(algorithm, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 2, 15, 20)
    )
    config = load_config(TrainCommandConfig, path)
    assert config.trainer.algorithm == algorithm and config.trainer.actor.lr == 5e-6
    assert config.orchestrator.batch_size == 32 and config.orchestrator.group_size == 8
    assert config.env.sampling.max_tokens == 12 and config.env.sampling.temperature == 1.0
    assert config.loop.max_minutes == 15 and config.loop.seed == 2 and config.trainer.seed == 2
    # no eval of its own (charged to its budget, where TRL's are not): a snapshot of the
    # weights every 20 steps for the judge instead, and one checkpoint, at the end
    assert config.eval.every == 0
    assert config.loop.snapshot_every == 20 and config.loop.checkpoint_every >= 100_000


def run(
    system: str,
    seed: int,
    accuracy: float,
    steps: int,
    task: str = "hard",
    curve: list | None = None,
) -> dict:
    return {"system": system, "seed": seed, "accuracy_after": accuracy, "steps": steps,
            "task": task, "curve": curve or [[15.0, accuracy]]}  # fmt: skip


def test_targets_compare_means_worst_seeds_and_steps_with_trl() -> None:
    runs = [
        run("trl", 0, 0.58, 90), run("trl", 1, 0.015, 103),
        run("tracerl-grpo", 0, 0.60, 200, curve=[[3.0, 0.4], [6.5, 0.58], [15.0, 0.6]]),
        run("tracerl-grpo", 1, 0.30, 180, curve=[[3.0, 0.01], [7.0, 0.2], [15.0, 0.3]]),
        run("tracerl-ppo", 0, 0.20, 150), run("tracerl-ppo", 1, 0.20, 150),
    ]  # fmt: skip
    summary = summarise(runs, ["hard"], 15.0)
    hard = summary["tasks"]["hard"]
    assert hard["systems"]["trl"]["accuracy_worst"] == 0.015
    assert hard["grpo_vs_trl"]["accuracy_mean_ratio"] == pytest.approx(0.45 / 0.2975)
    # the first judged point at or above TRL's final on the same seed
    assert hard["grpo_vs_trl"]["minutes_to_trl_final"] == {0: 6.5, 1: 7.0}
    assert hard["targets"] == {
        "grpo_mean_ge_1.3x_trl": True,
        "grpo_worst_ge_trl_worst": True,
        "grpo_steps_ge_1.5x_trl": True,
        "grpo_reaches_trl_final_in_half_budget": True,  # 6.5 and 7.0 <= 7.5
        "ppo_mean_ge_trl_mean": False,  # 0.20 < 0.2975
    }
    assert summary["target_met"] is False
    late = summarise(runs, ["hard"], 13.0)["tasks"]["hard"]  # half of it: 6.5, seed 1 late
    assert late["targets"]["grpo_reaches_trl_final_in_half_budget"] is False
    never = [*runs[:2], run("tracerl-grpo", 0, 0.5, 200), run("tracerl-grpo", 1, 0.3, 180)]
    summary = summarise(never, ["hard"], 15.0)["tasks"]["hard"]
    assert summary["grpo_vs_trl"]["minutes_to_trl_final"] == {0: None, 1: 15.0}
    assert summary["targets"]["grpo_reaches_trl_final_in_half_budget"] is False
    # a task with no TRL run cannot meet its targets
    assert summarise([run("tracerl-grpo", 0, 1.0, 10)], ["hard"], 15.0)["target_met"] is False


def test_included_runs_are_checked_before_any_training(tmp_path: Path) -> None:
    """`--include` folds an earlier run's seeds into the summary; a missing file, or a run this
    one would repeat, stops the benchmark before it loads a model."""
    import argparse
    import json

    from tracerl.bench import learn

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "runs.jsonl").write_text(
        "\n".join(
            json.dumps({**r, "accuracy_before": 0.1})
            for r in [run("tracerl-grpo", 0, 0.6, 90), run("trl", 0, 0.5, 40)]
        )
    )

    def args(include: list[str], first_seed: int) -> argparse.Namespace:
        return argparse.Namespace(
            tasks="hard", systems="tracerl-grpo", seeds=1, first_seed=first_seed,
            include=include, work_dir=str(tmp_path / f"work{first_seed}"), minutes=1.0,
            eval_every=20,
        )  # fmt: skip

    with pytest.raises(SystemExit, match="hard/tracerl-grpo/seed0"):
        learn.main(args([str(earlier)], first_seed=0))
    with pytest.raises(SystemExit, match="cannot read"):
        learn.main(args([str(tmp_path / "missing")], first_seed=1))
    assert not (tmp_path / "work0").exists() and not (tmp_path / "work1").exists()
    assert [r["seed"] for r in learn.read_included(earlier, ["hard"])] == [0, 0]
    assert learn.read_included(earlier, ["medium"]) == []
    # WORK_DIR:SYSTEMS takes those systems' runs only; a system it does not hold is refused
    assert learn.include_spec(f"{earlier}:trl") == (earlier, ["trl"])
    assert learn.include_spec(str(earlier)) == (earlier, None)
    assert [r["system"] for r in learn.read_included(earlier, ["hard"], ["trl"])] == ["trl"]
    from tracerl.cli.main import main

    pooled = tmp_path / "pooled"
    argv = ["bench", "learn", "--tasks", "hard", "--seeds", "0", "--work-dir", str(pooled)]
    assert main([*argv, "--include", f"{earlier}:trl"]) == 0
    assert [json.loads(r)["system"] for r in (pooled / "runs.jsonl").open()] == ["trl"]
    with pytest.raises(SystemExit, match="holds no runs of tracerl-ppo \\(it holds "
                       "tracerl-grpo, trl\\)"):  # fmt: skip
        learn.read_included(earlier, ["hard"], ["trl", "tracerl-ppo"])
    with pytest.raises(SystemExit, match="name systems after the ':'"):
        learn.include_spec(f"{earlier}:")


def test_the_judge_reads_the_snapshot_a_run_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The judge scores a snapshot's trained weights (what `loop.snapshot_every` writes: the
    trainer's export), not the base model's (a judge once read a file the run no longer
    wrote, and every run of `bench learn` failed after its training)."""
    import torch

    from tracerl.bench import learn, learn_tasks
    from tracerl.config.train import TrainerConfig
    from tracerl.train import Trainer
    from tracerl.train.export import snapshot_path

    trainer = Trainer(TrainerConfig(model="tiny", algorithm="grpo"), device="cpu")
    with torch.no_grad():
        trainer.actor.lm_head.weight.mul_(3.0)  # weights the base model does not have
    run_dir = tmp_path / "run"
    trainer.export(snapshot_path(run_dir, 7))
    _, heldout = split_tasks("medium", 20, 4, seed=0)
    learn.write_jsonl(tmp_path / "heldout.jsonl", heldout)
    scored = []

    def greedy(model, tokenizer, tasks):  # the real scoring, on the model it was given
        scored.append(model.lm_head.weight.detach().clone())
        return accuracy(model, tokenizer, tasks)

    accuracy = learn_tasks.greedy_accuracy
    monkeypatch.setattr(learn_tasks, "greedy_accuracy", greedy)
    assert 0.0 <= learn.judge_snapshot(run_dir, tmp_path, 7) <= 1.0
    assert torch.equal(scored[0], trainer.actor.lm_head.weight)


def test_overrides_are_checked_before_any_training(tmp_path: Path, capsys) -> None:
    """`tracerl train` overrides given to `bench learn` apply to its tracerl runs: a key no config
    takes, or a setting that differs from an included run of the same system, stops the
    benchmark before it writes anything; other benchmarks refuse overrides."""
    import json

    from tracerl.bench import learn
    from tracerl.cli.main import main

    work = tmp_path / "work"
    argv = ["bench", "learn", "--tasks", "hard", "--systems", "tracerl-grpo", "--seeds", "1"]
    with pytest.raises(SystemExit, match="trainer.no_such: unknown key"):
        main([*argv, "--work-dir", str(work), "--trainer.no_such=1"])
    assert not work.exists()
    assert main(["bench", "gateway", "--trainer.autocast=bfloat16"]) == 2
    assert "only bench learn" in capsys.readouterr().err

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    plain = {**run("tracerl-grpo", 0, 0.6, 90), "overrides": []}
    (earlier / "runs.jsonl").write_text(json.dumps(plain) + "\n")
    with pytest.raises(SystemExit, match="hard/tracerl-grpo ran seed0 with overrides \\[\\]"):
        main([*argv, "--first-seed", "1", "--include", str(earlier), "--work-dir", str(work),
              "--trainer.autocast=bfloat16"])  # fmt: skip
    assert not work.exists()
    # TRL's runs take no overrides; the same setting, or a system not run again, passes
    bf16 = ["trainer.autocast=bfloat16"]
    learn.check_overrides(bf16, [run("trl", 0, 0.5, 40)], {("hard", "tracerl-grpo", 0)})
    learn.check_overrides([], [plain], {("hard", "tracerl-grpo", 1)})
    learn.check_overrides(bf16, [plain], {("hard", "tracerl-ppo", 1)})
    with pytest.raises(SystemExit, match="seed0 with overrides \\[\\] and seed1"):
        learn.check_overrides([], [plain, {**plain, "seed": 1, "overrides": bf16}], set())


def test_a_tracerl_run_is_judged_on_every_snapshot_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No eval in the run (charged to its budget, where TRL's evals are not): after it, the
    judge scores each snapshot at the minute its step ended; the last point is the run's
    score, the overrides reach `tracerl train`, and the snapshots and checkpoint are removed."""
    import json

    from tracerl.bench import learn, learn_agents
    from tracerl.train.export import snapshot_path

    task_dir = tmp_path / "hard"
    task_dir.mkdir()
    launched: list[tuple[str, ...]] = []

    def fake_train(config: Path, run_dir: Path, timeout_s: float, *extra: str) -> float:
        launched.append(extra)
        assert load_config(TrainCommandConfig, config).eval.every == 0
        run_dir.mkdir()
        rows = [{"step": s, "rollout/reward_mean": 0.1, "time/elapsed_s": 30.0 * s}
                for s in range(1, 48)]  # fmt: skip
        rows.insert(20, {"step": 20, "system/cpu": 1.0, "time/elapsed_s": 9999.0})
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        for step in (20, 40, 47):
            snapshot_path(run_dir, step).mkdir(parents=True)
            (snapshot_path(run_dir, step) / "config.json").write_text("{}")
        (run_dir / "checkpoints" / "step_00000047").mkdir(parents=True)  # the final checkpoint
        return 1400.0

    judged: list[int] = []

    def fake_judge(run_dir: Path, task: Path, step: int) -> float:
        judged.append(step)
        return {20: 0.5, 40: 0.75, 47: 0.7}[step]

    monkeypatch.setattr(learn_agents, "train", fake_train)
    monkeypatch.setattr(learn, "judge_snapshot", fake_judge)
    record = learn.run_tracerl("grpo", task_dir, 1, 15.0, 20, ["trainer.autocast=bfloat16"])
    assert launched == [("--trainer.autocast=bfloat16",)]
    assert judged == [20, 40, 47]
    assert record["curve"] == [[10.0, 0.5], [20.0, 0.75], [23.5, 0.7]]
    assert record["accuracy_after"] == 0.7 and record["steps"] == 47
    assert record["overrides"] == ["trainer.autocast=bfloat16"]
    assert not (task_dir / "tracerl-grpo-seed1" / "snapshots").exists()
    assert not (task_dir / "tracerl-grpo-seed1" / "checkpoints").exists()


def test_seeds_0_summarises_earlier_runs_without_running_any(tmp_path: Path, capsys) -> None:
    """`--seeds 0` pools the `--include` work dirs' runs (seeds run by separate commands) into
    one summary line, and WORK_DIR holds them and their curves; it trains and loads nothing,
    and without `--include` it is refused."""
    import json

    from tracerl.cli.main import main

    def agent(system: str, seed: int, success: float, curve: list) -> dict:
        line = run(system, seed, success, 20, task="files", curve=curve)
        return {**line, "overrides": [], "accuracy_before": 0.2}

    earlier, later = tmp_path / "earlier", tmp_path / "later"
    for path, runs in (
        (earlier, [agent("trl", s, 0.2, [[5, 0.2], [15, 0.2]]) for s in (0, 1, 2)]),
        (later, [agent("tracerl-grpo", s, 0.4, [[5, 0.3], [15, 0.4]]) for s in (0, 1, 2)]),
    ):
        path.mkdir()
        (path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    argv = ["bench", "learn", "--tasks", "files", "--seeds", "0"]
    with pytest.raises(SystemExit, match="--include"):
        main([*argv, "--work-dir", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="hold no runs of medium"):
        main(["bench", "learn", "--tasks", "medium", "--seeds", "0", "--include", str(earlier),
              "--work-dir", str(tmp_path / "none")])  # fmt: skip
    assert not (tmp_path / "none").exists()
    work = tmp_path / "pooled"
    assert main([*argv, "--include", str(earlier), "--include", str(later),
                 "--work-dir", str(work)]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    files = summary["tasks"]["files"]
    assert files["systems"]["tracerl-grpo"]["seeds"] == files["systems"]["trl"]["seeds"] == 3
    assert files["tracerl-grpo_vs_trl"]["minutes_to_trl_final"] == {"0": 5, "1": 5, "2": 5}
    assert summary["target_met"] is True and summary["seeds"] == 0
    assert len((work / "runs.jsonl").read_text().splitlines()) == 6
    assert (work / "learn_curves.png").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["learn_curves.png", "runs.jsonl"]


def test_every_system_samples_at_the_temperature_given(tmp_path: Path, capsys) -> None:
    """`--temperature T` reaches both sides: tracerl's runs as config overrides (trainer and
    env sampling alike, which a config must take), TRL's harness as its argument; a
    summary never pools one system's runs sampled at two temperatures (runs recorded before
    the option sampled at 1), two systems may differ, and the summary says each one's."""
    import argparse
    import json

    from tracerl.bench import learn, learn_trl
    from tracerl.cli.main import main

    assert learn.sampling_overrides(1.0) == []
    cooler = learn.sampling_overrides(0.7)
    assert cooler == ["trainer.temperature=0.7", "env.sampling.temperature=0.7"]
    learn.check_overrides(cooler, [], {("files", "tracerl-ppo", 0)})  # a config takes them
    parser = argparse.ArgumentParser()
    learn_trl.add_arguments(parser, group_size=4, max_new_tokens=64)
    base = ["--train", "t.jsonl", "--seed", "0", "--minutes", "1", "--out", str(tmp_path)]
    assert parser.parse_args(base).temperature == 1.0
    assert parser.parse_args([*base, "--temperature", "0.7"]).temperature == 0.7

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    trl = {**run("trl", 0, 0.2, 10, task="files"), "accuracy_before": 0.2, "overrides": []}
    ppo = {**trl, "system": "tracerl-ppo", "accuracy_after": 0.3}
    lines = [trl, {**trl, "seed": 1, "temperature": 0.7}]  # TRL at 1 (no field), then 0.7
    (earlier / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    argv = ["bench", "learn", "--tasks", "files", "--include", str(earlier)]
    with pytest.raises(SystemExit, match=r"files/trl sampled at temperature 1.0 \(seed0\) and "
                       r"at 0.7 \(seed1, --include\): one system's runs"):  # fmt: skip
        main([*argv, "--seeds", "0", "--work-dir", str(tmp_path / "w0")])
    (earlier / "runs.jsonl").write_text(json.dumps(ppo) + "\n")  # PPO at 1 ...
    with pytest.raises(SystemExit, match=r"tracerl-ppo sampled at temperature 0.7 \(seed1, run "
                       r"now\) and at 1.0 \(seed0, --include\)"):  # fmt: skip
        # ... refused before any run starts, beside seeds of its own at 0.7
        main([*argv, "--systems", "tracerl-ppo", "--seeds", "1", "--first-seed", "1",
              "--temperature", "0.7", "--work-dir", str(tmp_path / "w1")])  # fmt: skip
    with pytest.raises(SystemExit, match="--temperature must be above 0"):
        main([*argv, "--seeds", "0", "--temperature", "0", "--work-dir", str(tmp_path / "w2")])
    assert not any((tmp_path / w).exists() for w in ("w0", "w1", "w2"))
    # each system at its own temperature: the baseline at its better setting
    lines = [ppo, {**trl, "temperature": 0.7}]
    (earlier / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    argv = [*argv, "--seeds", "0", "--temperature", "0.7", "--work-dir", str(tmp_path / "w3")]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    systems = summary["tasks"]["files"]["systems"]
    assert systems["tracerl-ppo"]["temperature"] == 1.0 and systems["trl"]["temperature"] == 0.7
    assert summary["temperature"] is None and summary["overrides"] == []  # it started no run
    assert summary["machine"] is None  # nor ran on any machine
    versus = summary["tasks"]["files"]["tracerl-ppo_vs_trl"]
    assert versus["success_mean_ratio"] == pytest.approx(1.5)


def test_trl_s_harness_samples_at_the_temperature_given(tmp_path: Path) -> None:
    """The TRL harness's GRPOConfig takes `--temperature` (needs TRL: `.[bench]`)."""
    import argparse

    pytest.importorskip("trl")
    from tracerl.bench import learn_trl

    parser = argparse.ArgumentParser()
    learn_trl.add_arguments(parser, group_size=4, max_new_tokens=64)
    base = ["--train", "t.jsonl", "--seed", "0", "--minutes", "1", "--out", str(tmp_path)]
    assert learn_trl.grpo_config(parser.parse_args(base)).temperature == 1.0
    cooler_trl = learn_trl.grpo_config(parser.parse_args([*base, "--temperature", "0.7"]))
    assert cooler_trl.temperature == 0.7


def test_trl_s_harness_autocasts_to_bf16_only_where_the_cpu_computes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--precision auto` (the default): bf16 autocast where the CPU has bf16 arithmetic, float32
    where torch would emulate it (7x slower per matmul on an AVX2-only CPU)."""
    import argparse

    from tracerl.bench import learn_trl

    parser = argparse.ArgumentParser()
    learn_trl.add_arguments(parser, group_size=4, max_new_tokens=64)
    base = ["--train", "t.jsonl", "--seed", "0", "--minutes", "1", "--out", str(tmp_path)]
    assert parser.parse_args(base).precision == "auto"
    for native, chosen in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(learn_trl, "native_bf16", lambda native=native: native)
        assert learn_trl.precision("auto") == chosen
        assert learn_trl.precision("bf16") == "bf16" and learn_trl.precision("fp32") == "fp32"
        if importlib.util.find_spec("trl") is not None:
            assert learn_trl.grpo_config(parser.parse_args(base)).bf16 is native


def test_a_run_s_summary_names_the_machine_it_ran_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step times compare only on one machine: the summary line of runs started now says the
    CPU, its cores and whether it computes bf16 natively."""
    import os

    from tracerl.bench import learn, learn_trl

    monkeypatch.setattr(learn_trl, "native_bf16", lambda: True)
    found = learn.machine()
    assert found["cores"] == os.cpu_count() and found["native_bf16"] is True
    assert isinstance(found["cpu"], str) and found["cpu"]
