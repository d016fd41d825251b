"""`tracerl bench learn`: its tasks, the configs it runs, and how it judges the runs."""

from __future__ import annotations

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
    assert config.eval.sampling.temperature == 0  # greedy, like the judge


def run(system: str, seed: int, accuracy: float, steps: int, task: str = "hard") -> dict:
    return {"system": system, "seed": seed, "accuracy_after": accuracy, "steps": steps,
            "task": task}  # fmt: skip


def test_targets_compare_means_worst_seeds_and_steps_with_trl() -> None:
    runs = [
        run("trl", 0, 0.58, 90), run("trl", 1, 0.015, 103),
        run("tracerl-grpo", 0, 0.60, 200), run("tracerl-grpo", 1, 0.30, 180),
        run("tracerl-ppo", 0, 0.20, 150), run("tracerl-ppo", 1, 0.20, 150),
    ]  # fmt: skip
    summary = summarise(runs, ["hard"])
    hard = summary["tasks"]["hard"]
    assert hard["systems"]["trl"]["accuracy_worst"] == 0.015
    assert hard["grpo_vs_trl"]["accuracy_mean_ratio"] == pytest.approx(0.45 / 0.2975)
    assert hard["targets"] == {
        "grpo_mean_ge_1.3x_trl": True,
        "grpo_worst_ge_trl_worst": True,
        "grpo_steps_ge_1.5x_trl": True,
        "ppo_mean_ge_trl_mean": False,  # 0.20 < 0.2975
    }
    assert summary["target_met"] is False
    # a task with no TRL run cannot meet its targets
    assert summarise([run("tracerl-grpo", 0, 1.0, 10)], ["hard"])["target_met"] is False


def test_included_runs_are_checked_before_any_training(tmp_path: Path) -> None:
    """`--include` folds an earlier run's seeds into the summary; a missing file, or a run this
    one would repeat, stops the benchmark before it loads a model."""
    import argparse
    import json

    from tracerl.bench import learn

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "runs.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [run("tracerl-grpo", 0, 0.6, 90), run("trl", 0, 0.5, 40)])
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


def test_the_judge_reads_the_checkpoint_a_run_writes(tmp_path: Path) -> None:
    """The judge scores the newest checkpoint's trained weights (the format `tracerl train`
    writes now: DCP shards), not the base model's: it once looked for a file that format has
    no more, and every run of `bench learn` failed after its training."""
    import torch

    from tracerl.bench.learn import judge_checkpoint, write_jsonl
    from tracerl.config.train import TrainerConfig
    from tracerl.train import Trainer
    from tracerl.train.export import checkpoint_actor

    trainer = Trainer(TrainerConfig(model="tiny", algorithm="grpo"), device="cpu")
    with torch.no_grad():
        trainer.actor.lm_head.weight.mul_(3.0)  # weights the base model does not have
    run_dir = tmp_path / "run"
    trainer.save_checkpoint(run_dir / "checkpoints")
    actor, _, _ = checkpoint_actor(run_dir)
    assert torch.equal(actor.lm_head.weight, trainer.actor.lm_head.weight)
    _, heldout = split_tasks("medium", 20, 4, seed=0)
    write_jsonl(tmp_path / "heldout.jsonl", heldout)
    assert 0.0 <= judge_checkpoint(run_dir, tmp_path) <= 1.0
