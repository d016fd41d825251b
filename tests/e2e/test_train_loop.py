"""The RL loop end to end on the `tiny` model: real embedded engine, real gateway over HTTP, the
official openai SDK in the environments, the SQLite store, the trainer, weight sync, checkpoints,
resume, SIGKILL and Ctrl-C."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tracerl.config import TrainCommandConfig, load_config
from tracerl.envs.registry import generate_tasks
from tracerl.gateway.store import SQLiteTraceStore
from tracerl.run.loop import RLLoop

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
TINY = ROOT / "examples" / "tiny.toml"


def tiny_config(*overrides: str) -> TrainCommandConfig:
    return load_config(TrainCommandConfig, TINY, ["logging.progress=false", *overrides])


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps(run_dir: Path) -> list[int]:
    return [int(r["step"]) for r in metrics(run_dir) if "rollout/reward_mean" in r]


def sessions(run_dir: Path) -> int:
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return int(db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])


FINITE = ("rollout/reward_mean", "actor/policy_loss", "actor/grad_norm", "perf/tokens_per_s")


async def test_grpo_steps_record_traces_checkpoint_and_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    loop = RLLoop(tiny_config("loop.steps=2"), run_dir)
    assert await loop.run() == 0
    records = metrics(run_dir)
    # an episode costs the controller what the engine held for it (prompt + completion)
    costs = [c.value for (_, kind), c in loop.controller.state.costs.items() if kind == "train"]
    assert len(costs) == 1 and costs[0] is not None
    completion = max(r["rollout/completion_tokens_mean"] for r in records)
    held = statistics.fmean(r["rollout/sample_tokens_mean"] for r in records)
    assert costs[0] > completion and costs[0] == pytest.approx(held, rel=0.25)
    assert steps(run_dir) == [1, 2]
    for record in records:
        for key in FINITE:
            assert math.isfinite(record[key]), key
        assert record["rollout/samples"] == 8
        assert record["rollout/staleness_max"] <= 1
        # the dispatcher's gauges: in flight by kind, and the lag of what is in flight
        assert record["concurrency/inflight"] == (
            record["concurrency/inflight_train"] + record["concurrency/inflight_eval"]
        )
        assert 0 <= record["concurrency/offpolicy_mean"] <= record["concurrency/offpolicy_max"]
        # this process's memory (the tiny model's engine and trainer are in it)
        assert 0.05 < record["memory/rss_gib"] < record["memory/rss_peak_gib"] + 0.01 < 24
        # a checkpoint every step (the default): each step's record says what its write took
        assert record["time/checkpoint_s"] > 0
    assert (run_dir / "checkpoints" / "step_00000002").is_dir()
    recorded = sessions(run_dir)
    assert recorded >= 16  # two steps of 8 episodes, each a gateway session
    # every ended episode has its line for `tracerl view`, naming a session of the store
    lines = [json.loads(x) for x in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(lines) >= 16 and {line["step"] for line in lines} >= {0, 1}
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        stored = {row[0] for row in db.execute("SELECT id FROM sessions")}
    assert {line["session_id"] for line in lines} <= stored
    store = SQLiteTraceStore(run_dir / "traces.sqlite")
    try:
        trace = await store.trace(await _any_session(run_dir))
        assert trace is not None and trace.trajectories
        assert sum(trace.trajectories[0].loss_mask) == len(trace.turns[0].completion_ids)
    finally:
        await store.close()

    assert await RLLoop(tiny_config("loop.steps=3"), run_dir, resume=True).run() == 0
    assert steps(run_dir) == [1, 2, 3]  # the step count continued
    assert sessions(run_dir) > recorded  # the same store, appended to


async def test_snapshots_hold_the_weights_of_their_step_and_the_last(tmp_path: Path) -> None:
    """`loop.snapshot_every`: every N steps and at the end, the actor's weights as `tracerl
    export` writes them (loadable by transformers), each its step's own weights, the write's
    time on its step's record; checkpoints keep their own interval."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tracerl.train.export import checkpoint_actor, list_snapshots

    config = tiny_config("loop.steps=3", "loop.snapshot_every=2", "loop.checkpoint_every=100")
    assert await RLLoop(config, tmp_path).run() == 0
    snapshots = list_snapshots(tmp_path)
    assert list(snapshots) == [2, 3]  # step 2, and the last
    records = {int(r["step"]): r for r in metrics(tmp_path) if "rollout/reward_mean" in r}
    assert records[2]["time/snapshot_s"] > 0
    assert "time/snapshot_s" not in records[1] and "time/checkpoint_s" not in records[2]
    actor, _, _ = checkpoint_actor(tmp_path, 3)  # the end's checkpoint, the only one
    last = load_file(snapshots[3] / "model.safetensors")
    assert all(torch.equal(last[name], tensor) for name, tensor in actor.state_dict().items()
               if name in last)  # fmt: skip
    assert len(last) >= len(actor.state_dict()) - 1  # all of it (a tied head may be one name)
    step2 = load_file(snapshots[2] / "model.safetensors")
    assert any(not torch.equal(step2[name], last[name]) for name in last)  # step 3 trained
    AutoModelForCausalLM.from_pretrained(snapshots[2])  # a model directory as exported


async def _any_session(run_dir: Path) -> str:
    """A session with a recorded turn: episodes cancelled when the run stopped (or shed) leave
    sessions without any, and `SELECT id FROM sessions` returns the smallest random id."""
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        return str(db.execute("SELECT session_id FROM turns LIMIT 1").fetchone()[0])


async def test_ppo_with_critic_warmup_and_kl_in_reward(tmp_path: Path) -> None:
    config = tiny_config(
        "trainer.algorithm=ppo",
        "trainer.critic_warmup_steps=1",
        "trainer.kl_reward_coef=0.01",
        "loop.steps=2",
        "loop.max_off_policy_steps=0",
    )
    assert await RLLoop(config, tmp_path).run() == 0
    first, second = (r for r in metrics(tmp_path) if "rollout/reward_mean" in r)
    assert first["critic/warmup"] == 1.0 and "actor/policy_loss" not in first  # critic only
    assert second["actor/updates"] >= 1.0 and math.isfinite(second["actor/policy_loss"])
    for record in (first, second):
        assert math.isfinite(record["critic/value_loss"])
        assert record["rollout/staleness_max"] == 0  # synchronous: only current weights


async def test_eval_runs_on_held_out_tasks(tmp_path: Path) -> None:
    config = tiny_config(
        "loop.steps=1",
        "eval.every=1",
        "eval_dataset.generate=concise",
        "eval_dataset.num_tasks=4",
        "eval_dataset.seed=9",
    )
    assert await RLLoop(config, tmp_path).run() == 0
    evals = [r for r in metrics(tmp_path) if "eval/reward_mean" in r]
    assert sorted(r["step"] for r in evals) == [0, 1]  # the untrained baseline, then step 1
    assert all(r["eval/episodes"] == 4 for r in evals)
    for record in evals:  # every eval episode ran on the weights of the step it reports
        assert record["eval/weight_version_min"] == record["eval/weight_version_max"]
        assert record["eval/weight_version_max"] == record["step"]
    for record in evals:  # greedy by default: one sample per task, accuracy is pass@1
        assert record["eval/accuracy"] == record["eval/pass@1"]
        assert 0 <= record["eval/accuracy"] <= 1 and record["time/elapsed_s"] > 0


async def test_zero_steps_evaluates_the_starting_weights_and_trains_nothing(
    tmp_path: Path,
) -> None:
    config = tiny_config(
        "loop.steps=0",
        "eval.every=1",
        "eval_dataset.generate=concise",
        "eval_dataset.num_tasks=4",
        "eval_dataset.seed=9",
        "eval.by=max_words",
    )
    assert await RLLoop(config, tmp_path).run() == 0
    records = metrics(tmp_path)
    (evaluation,) = [r for r in records if "eval/reward_mean" in r]
    assert evaluation["step"] == 0 and evaluation["eval/episodes"] == 4
    # eval.by: the accuracy per value of the tasks' max_words, which together make up the whole
    limits = [t["max_words"] for t in generate_tasks("concise", 4, 9)]
    by = {k: v for k, v in evaluation.items() if k.startswith("eval/accuracy/")}
    assert set(by) == {f"eval/accuracy/max_words={n}" for n in limits}
    whole = sum(by[f"eval/accuracy/max_words={n}"] for n in limits) / len(limits)
    assert whole == pytest.approx(evaluation["eval/accuracy"])
    assert not [r for r in records if "rollout/reward_mean" in r]  # no step
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "episodes.jsonl").open()]
    assert kinds == ["eval"] * 4  # no training episode was played
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())
    with pytest.raises(ValueError, match="loop.steps is 0"):
        tiny_config("loop.steps=0")


def eval_turns(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The recorded turns of the eval episodes at `step` (tagged in the session's metadata)."""
    out = []
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        rows = db.execute(
            "SELECT s.meta, t.data FROM sessions s JOIN turns t ON t.session_id = s.id"
        ).fetchall()
    for meta, data in rows:
        tags = json.loads(meta)["metadata"]
        if tags.get("kind") == "eval" and (-tags["group"] - 1) // 1_000_000 == step:
            out.append(json.loads(data))
    return out


async def test_eval_is_greedy_by_default_and_pass_at_k_samples(
    tmp_path: Path, tiny: tuple[Any, Any]
) -> None:
    """Eval decodes greedily (temperature 0, whatever the training temperature): every eval
    turn asked for temperature 0 and its tokens are the argmax of an independent forward.
    (Exact equality of two runs is not asserted: batched float32 kernels may round a near-tie
    of the random `tiny` model either way when other requests share the batch.)
    pass@k samples each task k times at a temperature."""
    from tests.conftest import reference_logprobs

    common = ("loop.steps=1", "eval.every=1", "eval_dataset.generate=concise",
              "eval_dataset.num_tasks=4", "eval_dataset.seed=9")  # fmt: skip
    greedy = tmp_path / "greedy"
    greedy.mkdir()
    assert await RLLoop(tiny_config(*common), greedy).run() == 0
    turns = eval_turns(greedy, 0)
    assert len(turns) == 4
    model, _ = tiny
    for turn in turns:
        assert turn["request"]["temperature"] == 0 and turn["weight_version"] == 0
        prompt, first = turn["prompt_ids"], turn["completion_ids"][:1]
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1]
        assert first == [int(logits.argmax())]
        chosen = reference_logprobs(model, prompt, first, 0.0)
        engine_lp = torch.tensor(turn["completion_logprobs"][:1])
        if torch.cuda.is_available():  # a bfloat16 engine on the GPU (0.017 apart on an H200)
            torch.testing.assert_close(chosen, engine_lp, atol=0.1, rtol=0.05)
        else:
            torch.testing.assert_close(chosen, engine_lp)
    sampled = tmp_path / "k"
    sampled.mkdir()
    config = tiny_config(*common, "eval.samples=3", "eval.sampling.temperature=1.0")
    assert await RLLoop(config, sampled).run() == 0
    evals = [r for r in metrics(sampled) if "eval/reward_mean" in r]
    assert all(r["eval/episodes"] == 12 for r in evals)
    assert all(r["eval/pass@3"] >= r["eval/accuracy"] for r in evals)
    assert all(t["request"]["temperature"] == 1.0 for t in eval_turns(sampled, 0))


async def test_ppo_trains_on_groups_of_one_and_says_what_each_group_became(
    tmp_path: Path,
) -> None:
    config = tiny_config(
        "trainer.algorithm=ppo",
        "orchestrator.group_size=1",
        "orchestrator.batch_size=4",
        "loop.steps=2",
    )
    assert await RLLoop(config, tmp_path).run() == 0
    assert steps(tmp_path) == [1, 2]
    records = [r for r in metrics(tmp_path) if "rollout/reward_mean" in r]
    assert all(r["rollout/samples"] == 4 and r["actor/updates"] >= 1 for r in records)
    groups = [json.loads(x) for x in (tmp_path / "groups.jsonl").read_text().splitlines()]
    trained = [g for g in groups if g["outcome"] == "trained"]
    assert sorted(g["step"] for g in trained) == [1] * 4 + [2] * 4
    assert all(len(g["rewards"]) == 1 for g in trained)


async def test_uniform_groups_are_trained_or_waited_out_as_configured(tmp_path: Path) -> None:
    """Kept (the default): every step takes the next complete groups, uniform ones included.
    Filtered: uniform groups are dropped with their reason and a step waits for signal."""
    # max_tokens 1: a one-word reply scores 1.0 under `concise`, so most groups are uniform
    kept = tmp_path / "kept"
    kept.mkdir()
    assert await RLLoop(tiny_config("loop.steps=2", "env.sampling.max_tokens=1"), kept).run() == 0
    records = [r for r in metrics(kept) if "rollout/reward_mean" in r]
    assert [r["rollout/samples"] for r in records] == [8, 8]
    assert sum(r["groups/uniform"] for r in records) >= 1
    filtered = tmp_path / "filtered"
    filtered.mkdir()
    config = tiny_config(
        "loop.steps=1", "env.sampling.max_tokens=2", "trainer.filter_uniform_groups=true"
    )
    assert await RLLoop(config, filtered).run() == 0
    groups = [json.loads(x) for x in (filtered / "groups.jsonl").read_text().splitlines()]
    assert [g["outcome"] for g in groups].count("trained") == 2
    for g in groups:
        assert (g["outcome"] == "uniform rewards") == (len(set(g["rewards"])) == 1), g


async def test_a_time_budget_ends_the_run_with_a_checkpoint_and_a_final_eval(
    tmp_path: Path,
) -> None:
    config = tiny_config(
        "loop.steps=1000",
        "loop.max_minutes=0.01",  # already spent by the time the model is loaded
        "eval.every=500",
        "eval_dataset.generate=concise",
        "eval_dataset.num_tasks=2",
    )
    assert await RLLoop(config, tmp_path).run() == 0
    evals = [r["step"] for r in metrics(tmp_path) if "eval/reward_mean" in r]
    done = steps(tmp_path)
    assert len(done) <= 1 and evals == [0, *done]  # baseline, then the final eval


async def test_an_external_agent_trains_and_its_failures_never_reach_the_trainer(
    tmp_path: Path,
) -> None:
    config = tiny_config(
        "env.name=command",
        f'env.argv=["{sys.executable}", "{ROOT / "tests" / "agents" / "flaky_agent.py"}"]',
        "env.timeout_s=60",
        "loop.steps=2",
    )
    assert await RLLoop(config, tmp_path).run() == 0
    failures = [
        json.loads(line) for line in (tmp_path / "episodes_failed.jsonl").read_text().splitlines()
    ]
    assert failures and all("exit" in f["reason"] and "3" in f["reason"] for f in failures)
    failed_sessions = {f["session_id"] for f in failures}
    store = SQLiteTraceStore(tmp_path / "traces.sqlite")
    try:  # the failed episodes' turns are recorded all the same...
        for sid in failed_sessions:
            trace = await store.trace(sid)
            assert trace is not None and trace.turns
    finally:
        await store.close()
    records = [r for r in metrics(tmp_path) if "rollout/reward_mean" in r]
    assert records[-1]["loop/episodes_failed"] >= len(failures)
    # ...but every trained episode printed a reward: 1 / (1 + words) is never 0
    assert all(0 < r["rollout/reward_mean"] <= 1 for r in records)


def _command(run_dir: Path, *args: str) -> list[str]:
    return [
        *(sys.executable, "-m", "tracerl.cli.main", "train", str(TINY)),
        *("--run-dir", str(run_dir), *args),
    ]


def _train(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _command(run_dir, "--logging.progress=false", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )


def _wait_for_steps(run_dir: Path, count: int, proc: subprocess.Popen[str], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").exists() and len(steps(run_dir)) >= count:
            return
        if proc.poll() is not None:
            raise AssertionError(f"training exited early:\n{proc.communicate()[0]}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"no {count} steps within {limit_s} s:\n{proc.communicate()[0]}")


@pytest.mark.parametrize("weights", [[], ["--trainer.lora.rank=4"]], ids=["full", "lora"])
def test_sigkill_mid_run_then_resume_loses_no_step_and_no_trace(
    tmp_path: Path, weights: list[str]
) -> None:
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "--loop.steps=6", *weights)
    _wait_for_steps(run_dir, 2, proc, limit_s=120)
    recorded = sessions(run_dir)
    os.killpg(proc.pid, signal.SIGKILL)  # the engine, gateway and trainer all die at once
    proc.wait(timeout=30)
    assert sessions(run_dir) >= recorded  # every committed trace survived
    resumed = _train(run_dir, "--loop.steps=6", "--resume", *weights)
    out, _ = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, out
    assert "resumed at step" in out
    assert steps(run_dir) == [1, 2, 3, 4, 5, 6]  # no duplicate, no gap
    assert sessions(run_dir) > recorded
    # every push, the resumed engine's first included, passed the weight probe
    probed = [r for r in metrics(run_dir) if "weights/probe_logprob_diff" in r]
    assert len(probed) == 6
    manifest = json.loads(next((run_dir / "checkpoints").glob("*/manifest.json")).read_text())
    assert (manifest["config"]["lora"] is not None) == bool(weights)
    # a LoRA run hands its engine the adapters alone: under 1 % of the model's bytes
    from tracerl.models import resolve_model

    model_bytes = sum(f.stat().st_size for f in Path(resolve_model("tiny")).glob("*.safetensors"))
    synced = [r["weights/sync_bytes"] for r in probed]
    assert all((b * 100 < model_bytes) == bool(weights) for b in synced), synced


def test_ctrl_c_checkpoints_and_stops_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "--loop.steps=50", "--loop.checkpoint_every=50")
    _wait_for_steps(run_dir, 1, proc, limit_s=120)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out  # stopped before its last step: not a success
    done = steps(run_dir)[-1]
    assert f"stopped at step {done}" in out
    # checkpoint_every=50 never fired: the one on disk is the stop's own
    assert (run_dir / "checkpoints" / f"step_{done:08d}").is_dir()
    assert sessions(run_dir) >= 8


def test_bad_config_fails_before_starting_anything(tmp_path: Path) -> None:
    run_dir = tmp_path / "never"
    # nothing heavy may load before the config is checked: here torch cannot even be imported
    poisoned = tmp_path / "poisoned"
    (poisoned / "torch").mkdir(parents=True)
    (poisoned / "torch" / "__init__.py").write_text(
        'raise ImportError("torch was imported before the config was validated")\n'
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(poisoned), str(ROOT / "src")])}
    result = subprocess.run(
        _command(run_dir, "--trainer.lr_typo=1", "--loop.steps=-3"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "trainer.lr_typo" in result.stderr and "loop.steps" in result.stderr
    assert "torch was imported" not in result.stderr
    assert not run_dir.exists()
    resume = subprocess.run(
        _command(run_dir, "--resume"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert resume.returncode == 2 and "no checkpoints" in resume.stderr
