"""`tracerl bench learn`'s agentic tasks: task files, the configs it runs, the TRL side's tools,
prompts and rewards (against tracerl's own environments), and the summary's targets. TRL itself
is not needed: the harness imports it only to train."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers.utils import get_json_schema

from tracerl.bench import learn_agents, learn_trl_agents
from tracerl.bench.learn_trl_agents import (
    TASKS,
    FileSystem,
    GuessGame,
    calculate,
    calls_answer_reward,
    check_same_prompt,
    dataset_rows,
    final_answer_reward,
    guess_reward,
)
from tracerl.config import TrainCommandConfig, load_config
from tracerl.envs.calculator import INSTRUCTION, ONE_OPERATION_ERROR
from tracerl.envs.registry import generate_tasks
from tracerl.gateway.render import ChatRenderer
from tracerl.models import load_tokenizer, resolve_model
from tracerl.train.export import snapshot_path


@pytest.mark.parametrize("task", ["calculator", "calculator-long", "files"])
def test_held_out_tasks_are_never_trained_on(tmp_path: Path, task: str) -> None:
    learn_agents.write_task_files(tmp_path, task)
    train, heldout = (
        [json.loads(line) for line in (tmp_path / f"{name}.jsonl").open()]
        for name in ("train", "heldout")
    )
    assert len(train) == learn_agents.TRAIN_TASKS
    assert len(heldout) == learn_agents.HELDOUT_TASKS
    # a calculator question; a file system (every files task has the same prompt)
    key = "files" if task == "files" else "prompt"
    assert not {json.dumps(t[key]) for t in train} & {json.dumps(t[key]) for t in heldout}


@pytest.mark.parametrize("task", learn_agents.AGENT_TASKS)
def test_the_generated_configs_run_the_same_settings(tmp_path: Path, task: str) -> None:
    learn_agents.write_task_files(tmp_path, task)
    configs = {
        "run": learn_agents.config(task, tmp_path, model="m", algorithm="ppo", seed=2, minutes=15),
        "start": learn_agents.config(task, tmp_path, model="m", steps=0, cold_start=True),
        "judge": learn_agents.config(task, tmp_path, model="m", steps=0),
    }
    loaded = {}
    for name, text in configs.items():
        (tmp_path / f"{name}.toml").write_text(text)
        loaded[name] = load_config(TrainCommandConfig, tmp_path / f"{name}.toml")
    run, start, judge = loaded["run"], loaded["start"], loaded["judge"]
    assert run.trainer.algorithm == "ppo" and run.loop.max_minutes == 15 and run.loop.seed == 2
    assert run.orchestrator.batch_size == 16 and run.orchestrator.group_size == 4
    assert run.trainer.chat_template == "chatml" and run.trainer.actor.lr == learn_agents.LR
    assert start.cold_start.demonstrations > 0 and start.loop.steps == 0
    assert judge.cold_start.demonstrations == 0 and judge.loop.steps == 0
    for config in loaded.values():  # one environment, one held-out set, greedy evals
        assert config.env == run.env and config.eval_dataset == run.eval_dataset
        assert config.eval.sampling.temperature == 0 and config.eval.every == 1
        # the judge's success per difficulty (the range, the search depth; none on the calculator)
        assert config.eval.by == learn_agents.DIFFICULTY_FIELDS.get(task)
    # calculator-long, -mixed: the calculator's environment, its own questions, one more turn
    assert run.env.name == task.split("-")[0]
    assert getattr(run.env, "single_operation", True)


@pytest.fixture(scope="module")
def chatml() -> Any:
    return load_tokenizer(resolve_model("tiny"), "chatml")


def test_every_agentic_task_has_its_trl_side() -> None:
    assert set(TASKS) == set(learn_agents.AGENT_TASKS)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_trl_sees_the_prompt_tracerl_renders(
    chatml: Any, task: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL builds its tool list from the functions (transformers' `get_json_schema`): it must
    be tracerl's tools exactly, in order, so both systems train on the same prompt tokens."""
    tools, functions = TASKS[task].tools, TASKS[task].functions
    assert [get_json_schema(f) for f in functions] == tools
    messages = [{"role": "user", "content": "What is 12 * 3 + 4?"}]
    ours = ChatRenderer(chatml).render(messages, tools)
    theirs = chatml.apply_chat_template(
        messages,
        tools=[get_json_schema(f) for f in functions],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert ours == theirs
    assert all(f'"{tool["function"]["name"]}"' in ours for tool in tools)
    check_same_prompt(chatml, task, messages)  # the harness's own guard passes...
    tool = tools[-1]
    changed = {**tool, "function": {**tool["function"], "description": "another"}}
    changed_side = TASKS[task]._replace(tools=[*tools[:-1], changed])
    monkeypatch.setitem(learn_trl_agents.TASKS, task, changed_side)
    with pytest.raises(SystemExit, match="differs"):  # ...and stops a run on a mismatch
        check_same_prompt(chatml, task, messages)


@pytest.mark.parametrize("task", learn_agents.AGENT_TASKS)
def test_trl_s_rows_hold_the_prompt_answer_and_state_of_tracerl_s_task(task: str) -> None:
    """TRL's dataset row: the user message tracerl's environment sends (the calculator's with
    its instruction), the answer, and what the environment's `reset` reads to set the task."""
    tasks = generate_tasks(task, 3, 0)
    rows = dataset_rows(TASKS[task], tasks)
    for task_row, row in zip(tasks, rows, strict=True):
        [message] = row["prompt"]
        suffix = f"\n{INSTRUCTION}" if task.startswith("calculator") else ""
        assert message == {"role": "user", "content": task_row["prompt"] + suffix}
        assert row["answer"] == task_row["answer"]
        columns = TASKS[task].columns
        assert set(row) == {"prompt", "answer", *columns}
        assert all(row[column] == task_row[column] for column in columns)
        environment = TASKS[task].environment
        if environment is None:  # stateless tools: nothing to reset
            continue
        env = environment()
        env.reset(**{k: v for k, v in row.items() if k != "prompt"})
        assert all(env.task[column] == task_row[column] for column in columns)


def test_trl_tools_answer_as_tracerl_s_environments_do() -> None:
    assert calculate("347 * 29") == "10063"
    assert calculate("347 * 29 + 18") == ONE_OPERATION_ERROR
    game = GuessGame()
    game.reset(answer=11, high=16, prompt="ignored")
    assert [game.guess(8), game.guess(17), game.guess(12)] == [
        "higher",
        "error: the number is from 1 to 16",
        "lower",
    ]
    assert not game.found and game.guess(11) == "correct: the number is 11" and game.found
    game.reset(answer=3, high=8)
    assert not game.found  # a new game
    files = FileSystem()
    files.reset(files=[{"path": "mail/passcode.txt", "text": "passcode: 4821"}], answer=4821)
    assert [
        files.list_files("/"),
        files.list_files("mail"),
        files.read_file("mail/passcode.txt"),
    ] == ["mail/", "passcode.txt", "passcode: 4821"]
    assert files.read_file("passcode.txt") == "error: no file passcode.txt"


def test_trl_rewards_score_the_last_reply_as_tracerl_does() -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "x"}}]}
    tool = {"role": "tool", "content": "10063"}
    answered = [call, tool, {"role": "assistant", "content": "The answer is 10081."}]
    wrong = [call, tool, {"role": "assistant", "content": "The answer is 10063."}]
    ran_out = [call, tool, call]  # still calling when the turns ran out
    assert final_answer_reward([answered, wrong, ran_out], [10081] * 3) == [1.0, 0.0, 0.0]
    # calculator-mixed: right only within the question's calls (one call per assistant message)
    twice = [call, tool, call, tool, answered[-1]]
    scored = calls_answer_reward([answered, twice, twice, wrong], [10081] * 4, [1, 1, 2, 2])
    assert scored == [1.0, 0.0, 1.0, 0.0]
    found, lost = GuessGame(), GuessGame()
    for game in (found, lost):
        game.reset(answer=5, high=8)
    found.guess(5)
    stated = [call, tool, {"role": "assistant", "content": "It is 5."}]
    rewards = guess_reward([ran_out, stated, ran_out], [5] * 3, [found, lost, lost])
    assert rewards == [1.0, 1.0, 0.0]  # found by a guess, stated at the end, neither


def agent_run(system: str, seed: int, success: float, curve: list[list[float]]) -> dict:
    return {"task": "guess", "system": system, "seed": seed, "accuracy_after": success,
            "steps": 10, "curve": curve}  # fmt: skip


def test_targets_compare_means_worst_seeds_and_time_to_trl_s_final_success() -> None:
    runs = [
        agent_run("trl", 0, 0.40, [[5, 0.2], [10, 0.3], [15, 0.4]]),
        agent_run("trl", 1, 0.30, [[5, 0.2], [15, 0.3]]),
        agent_run("tracerl-grpo", 0, 0.70, [[0, 0.1], [6, 0.45], [15, 0.7]]),
        agent_run("tracerl-grpo", 1, 0.50, [[0, 0.1], [4, 0.3], [15, 0.5]]),
        agent_run("tracerl-ppo", 0, 0.30, [[0, 0.1], [15, 0.3]]),
        agent_run("tracerl-ppo", 1, 0.60, [[0, 0.1], [7, 0.6]]),
        agent_run("tracerl-grpo-signal", 5, 0.90, [[0, 0.1], [1, 0.9]]),  # a seed TRL never ran
    ]
    summary = learn_agents.summarise(runs, ["guess"], minutes=15)
    guess = summary["tasks"]["guess"]
    grpo, ppo = guess["tracerl-grpo_vs_trl"], guess["tracerl-ppo_vs_trl"]
    assert grpo["success_mean_ratio"] == pytest.approx(0.6 / 0.35)
    assert grpo["minutes_to_trl_final"] == {0: 6, 1: 4}
    assert grpo["targets"] == {
        "mean_ge_1.3x_trl": True,
        "worst_ge_trl_worst": True,
        "reaches_trl_final_in_half_budget": True,
    }
    assert ppo["minutes_to_trl_final"] == {0: None, 1: 7}  # seed 0 never reached 0.40
    assert ppo["targets"]["reaches_trl_final_in_half_budget"] is False
    unshared = guess["tracerl-grpo-signal_vs_trl"]  # no seed in common: nothing shows it
    assert unshared["minutes_to_trl_final"] == {}
    assert unshared["targets"]["reaches_trl_final_in_half_budget"] is False
    assert guess["systems"]["trl"]["success_worst"] == 0.30
    assert summary["target_met"] is False


def snapshot(run_dir: Path, step: int) -> None:
    """What `loop.snapshot_every` leaves of a step: an exported model directory."""
    directory = snapshot_path(run_dir, step)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")


def test_the_judge_scores_thirds_half_and_last_snapshots(tmp_path: Path) -> None:
    """The snapshots nearest a third and two thirds of the budget (TRL's snapshots' points),
    the last one within half the budget (where the half-budget target is read) and the last."""
    with (tmp_path / "metrics.jsonl").open("w") as f:
        for step in range(1, 31):  # one step every 30 s
            f.write(json.dumps({"step": step, "rollout/reward_mean": 0.0,
                                "time/elapsed_s": 30.0 * step}) + "\n")  # fmt: skip
    for step in (*range(3, 31, 3), 31):  # every 3 steps; 31 was never logged (torn)
        snapshot(tmp_path, step)
    (tmp_path / "snapshots" / ".tmp-step_00000033-x").mkdir()  # a write in progress: never read
    (tmp_path / "snapshots" / "step_00000036").mkdir()  # nor one without its files
    # 15 minutes: 5 min is step 10 (saved: 9 at 4.5 min, 12 at 6), 7.5 min is step 15 (saved),
    # 10 min is step 20 (21)
    assert learn_agents.judged_steps(tmp_path, 15) == [
        (4.5, 9), (7.5, 15), (10.5, 21), (15.0, 30)
    ]  # fmt: skip
    # 16 minutes: the last within 8 is step 15 (18 is at 9), not the nearer one after it
    assert learn_agents.judged_steps(tmp_path, 16)[1] == (7.5, 15)
    # 9 minutes: a third is 3 (step 6), half is 4.5 (step 9), two thirds 6 (step 12)
    assert learn_agents.judged_steps(tmp_path, 9) == [(3.0, 6), (4.5, 9), (6.0, 12), (15.0, 30)]


def test_a_judged_snapshot_s_minutes_leave_out_the_writes_before_it(tmp_path: Path) -> None:
    """The snapshots exist for the judge, as TRL's judged weights do, whose time is left out
    of its minutes: each snapshot's minute is its step's end less the earlier snapshot and
    checkpoint writes (a step's record is logged after its own writes, whose time it carries)."""
    rows = [{"step": s, "rollout/reward_mean": 0.0, "time/elapsed_s": 60.0 * s} for s in (1, 2)]
    rows += [{"step": 3, "rollout/reward_mean": 0.0, "time/elapsed_s": 195.0}]
    rows[0]["time/checkpoint_s"] = 6.0  # a checkpoint after step 1 (no snapshot)
    rows[1]["time/snapshot_s"] = 12.0  # the snapshot after step 2
    rows[2]["time/snapshot_s"] = 30.0  # after step 3: after its own minute was taken
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step in (2, 3):
        snapshot(tmp_path, step)
    # (120 - 6) / 60 and (195 - 6 - 12) / 60
    assert learn_agents.saved_steps(tmp_path) == [(1.9, 2), (2.95, 3)]


def test_target_met_needs_three_seeds_headroom_and_more_than_a_zero_baseline() -> None:
    """One seed where TRL and PPO both end at 0 % meets nothing: the targets are stated for 3
    seeds with TRL below 70 %, and 1.3x of 0 is no improvement."""
    runs = [
        agent_run("trl", 0, 0.0, [[5, 0.0], [15, 0.0]]),
        agent_run("tracerl-grpo", 0, 0.98, [[5, 0.0], [15, 0.98]]),
        agent_run("tracerl-ppo", 0, 0.0, [[5, 0.0], [15, 0.0]]),
    ]
    summary = learn_agents.summarise(runs, ["guess"], minutes=15)
    guess = summary["tasks"]["guess"]
    assert guess["conditions"] == {"seeds_ge_3": False, "trl_mean_below_70pct": True}
    assert guess["tracerl-ppo_vs_trl"]["targets"]["mean_ge_1.3x_trl"] is False
    assert guess["tracerl-grpo_vs_trl"]["targets"]["mean_ge_1.3x_trl"] is True
    assert guess["tracerl-grpo_vs_trl"]["success_mean_ratio"] is None  # no ratio to 0
    assert summary["target_met"] is False
    # with no TRL run there is nothing to compare
    assert learn_agents.summarise(runs[1:], ["guess"], minutes=15)["target_met"] is False


def test_held_out_files_written_before_the_difficulty_field_are_judged_without_it(
    tmp_path: Path,
) -> None:
    learn_agents.write_task_files(tmp_path, "files")
    rows = [json.loads(line) for line in (tmp_path / "heldout.jsonl").open()]
    old = "".join(json.dumps({k: v for k, v in r.items() if k != "depth"}) + "\n" for r in rows)
    (tmp_path / "heldout.jsonl").write_text(old)  # as `bench learn` wrote them before f468ae7
    (tmp_path / "judge.toml").write_text(learn_agents.config("files", tmp_path, model="m", steps=0))
    assert load_config(TrainCommandConfig, tmp_path / "judge.toml").eval.by is None


def judged_dir(task_dir: Path, name: str, success: float, by: dict[str, float]) -> None:
    """What the judge leaves of one judged model: its run's eval record."""
    run_dir = task_dir / "judged" / name
    run_dir.mkdir(parents=True)
    record = {"step": 0, "eval/accuracy": success}
    record.update({f"eval/accuracy/{k}": v for k, v in by.items()})
    (run_dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")


def test_a_run_s_line_holds_its_final_success_per_difficulty(tmp_path: Path, monkeypatch) -> None:
    """tracerl's and TRL's lines carry the last judged point's success per value of the task's
    difficulty field (`accuracy_after_by`), read from that judge's run."""
    learn_agents.write_task_files(tmp_path, "files")
    monkeypatch.setattr(learn_agents, "train", lambda *args: 900.0)  # no real run
    points = [(5.0, 3), (15.0, 9)]
    monkeypatch.setattr(learn_agents, "judged_steps", lambda run_dir, minutes: points)

    def judge_step(task: str, task_dir: Path, run_dir: Path, step: int) -> float:
        judged_dir(task_dir, f"{run_dir.name}-step{step}", step / 10, {"depth=1": step / 9})
        return step / 10

    monkeypatch.setattr(learn_agents, "judge_step", judge_step)
    run_dir = tmp_path / "tracerl-grpo-seed0"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "rollout/reward_mean": 0.25, "time/elapsed_s": 30.0}) + "\n"
    )
    record = learn_agents.run_tracerl("files", tmp_path, tmp_path, "tracerl-grpo", 0, 15, 3, [])
    assert record["curve"] == [[5.0, 0.3], [15.0, 0.9]]
    assert record["accuracy_after_by"] == {"depth=1": 1.0}  # step 9's, not step 3's

    out = tmp_path / "trl-seed0"
    snapshots = [[5.0, str(out / "snap-5")], [15.0, str(out / "snap-15")]]

    def run_trl_process(command: list[str], log: Path, timeout_s: float, env: Any) -> float:
        for _, path in snapshots:
            Path(path).mkdir(parents=True)
        (out / "result.json").write_text(json.dumps({"system": "trl", "snapshots": snapshots}))
        return 900.0

    def judge(task: str, task_dir: Path, model: Path, name: str) -> float:
        judged_dir(task_dir, name, 0.2, {"depth=1": 0.5, "depth=2": 0.0})
        return 0.2

    monkeypatch.setattr(learn_agents, "run_logged", run_trl_process)
    monkeypatch.setattr(learn_agents, "judge", judge)
    trl = learn_agents.run_trl("files", tmp_path, tmp_path, 0, 15)
    assert trl["accuracy_after_by"] == {"depth=1": 0.5, "depth=2": 0.0}
    assert not Path(snapshots[-1][1]).exists()  # judged, then removed


def test_a_signal_system_draws_by_the_task_s_difficulty_field(tmp_path: Path) -> None:
    learn_agents.write_task_files(tmp_path, "guess")
    loaded = {}
    for system in ("tracerl-ppo", "tracerl-ppo-signal", "tracerl-grpo-signal"):
        text = learn_agents.run_config("guess", tmp_path, tmp_path, system, 1, 15, 3)
        (tmp_path / f"{system}.toml").write_text(text)
        loaded[system] = load_config(TrainCommandConfig, tmp_path / f"{system}.toml")
    plain, signal = loaded["tracerl-ppo"], loaded["tracerl-ppo-signal"]
    assert (plain.dataset.difficulty, plain.dataset.difficulty_by) == ("uniform", None)
    assert (signal.dataset.difficulty, signal.dataset.difficulty_by) == ("signal", "high")
    assert signal.dataset.path == plain.dataset.path and signal.trainer.algorithm == "ppo"
    assert loaded["tracerl-grpo-signal"].trainer.algorithm == "grpo"
    learn_agents.write_task_files(tmp_path, "files")  # the file search, by its search depth
    text = learn_agents.run_config("files", tmp_path, tmp_path, "tracerl-grpo-signal", 1, 15, 3)
    (tmp_path / "files.toml").write_text(text)
    files = load_config(TrainCommandConfig, tmp_path / "files.toml")
    assert (files.dataset.difficulty, files.dataset.difficulty_by) == ("signal", "depth")


def test_a_signal_system_refuses_a_task_without_a_difficulty_field(tmp_path: Path) -> None:
    from tracerl.bench import learn
    from tracerl.cli.main import build_parser

    args = build_parser().parse_args(
        ["bench", "learn", "--tasks", "guess,calculator", "--systems", "tracerl-grpo-signal",
         "--work-dir", str(tmp_path / "w")]
    )  # fmt: skip
    with pytest.raises(SystemExit, match="needs tasks with a difficulty field .calculator-mixed: "
                       "max_calls, guess: high, files: depth.; calculator has none"):  # fmt: skip
        learn.main(args)
    assert not (tmp_path / "w").exists()


def earlier_work_dir(work: Path, task: str = "files") -> Path:
    """What `bench learn` leaves of a task's start: its task files, the cold start's export and
    the start run's eval (the held-out success before)."""
    task_dir = work / task
    task_dir.mkdir(parents=True)
    learn_agents.write_task_files(task_dir, task)
    export = task_dir / "start" / "cold_start" / "export"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    (task_dir / "start" / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/accuracy": 0.22, "eval/accuracy/depth=1": 0.5}) + "\n"
    )
    return work


def test_a_later_seed_starts_from_an_earlier_run_s_start(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """`--start-from WORK_DIR`: every run starts from that run's start checkpoint and trains and
    is judged on its task files (copied), with its held-out success as the before."""
    earlier = earlier_work_dir(tmp_path / "earlier")
    calls = []

    def fake_run(task, task_dir, start, system, seed, minutes, every, overrides):
        calls.append((task, start, system, seed))
        return {"system": system, "seed": seed, "accuracy_after": 0.3, "steps": 5}

    monkeypatch.setattr(learn_agents, "run_tracerl", fake_run)
    work = tmp_path / "work"
    work.mkdir()
    runs = learn_agents.run_task("files", work, ["tracerl-grpo"], range(2, 3), 15, 3, [], earlier)
    export = earlier / "files" / "start" / "cold_start" / "export"
    assert calls == [("files", export, "tracerl-grpo", 2)]
    assert runs[0]["accuracy_before"] == 0.22 and runs[0]["start"] == str(export.resolve())
    start_line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert start_line["success_before_by"] == {"depth=1": 0.5}  # the earlier start's own eval
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (work / "files" / name).read_bytes() == (earlier / "files" / name).read_bytes()


def test_a_start_from_without_a_start_stops_before_any_training(tmp_path: Path) -> None:
    from tracerl.bench import learn
    from tracerl.cli.main import build_parser

    earlier = earlier_work_dir(tmp_path / "earlier")

    def main(*argv: str) -> None:
        args = build_parser().parse_args(
            ["bench", "learn", "--systems", "tracerl-grpo", "--work-dir", str(tmp_path / "w"),
             *argv]
        )  # fmt: skip
        learn.main(args)

    with pytest.raises(SystemExit, match="it has no start of guess .*guess/train.jsonl"):
        main("--tasks", "files,guess", "--start-from", str(earlier))
    with pytest.raises(SystemExit, match="--start-from is for the agentic tasks"):
        main("--tasks", "hard", "--start-from", str(earlier))
    (earlier / "files" / "start" / "metrics.jsonl").write_text("{}\n")  # no eval recorded
    with pytest.raises(SystemExit, match="its start of files has no held-out success"):
        main("--tasks", "files", "--start-from", str(earlier))
    assert not (tmp_path / "w").exists()
