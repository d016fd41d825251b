"""The RL loop end to end on the `tiny` model: real embedded engine, real gateway over HTTP, the
official openai SDK in the environments, the SQLite store, the trainer, weight sync, checkpoints,
resume, SIGKILL and Ctrl-C."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tracerl.config import TrainCommandConfig, load_config
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
    assert await RLLoop(tiny_config("loop.steps=2"), run_dir).run() == 0
    records = metrics(run_dir)
    assert steps(run_dir) == [1, 2]
    for record in records:
        for key in FINITE:
            assert math.isfinite(record[key]), key
        assert record["rollout/samples"] == 8
        assert record["rollout/staleness_max"] <= 1
    assert (run_dir / "checkpoints" / "step_00000002").is_dir()
    recorded = sessions(run_dir)
    assert recorded >= 16  # two steps of 8 episodes, each a gateway session
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


async def _any_session(run_dir: Path) -> str:
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        return str(db.execute("SELECT id FROM sessions LIMIT 1").fetchone()[0])


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
        "loop.eval_every=1",
        "eval_dataset.generate=concise",
        "eval_dataset.num_tasks=4",
        "eval_dataset.seed=9",
    )
    assert await RLLoop(config, tmp_path).run() == 0
    evals = [r for r in metrics(tmp_path) if "eval/reward_mean" in r]
    assert sorted(r["step"] for r in evals) == [0, 1]  # the untrained baseline, then step 1
    assert all(r["eval/episodes"] == 4 for r in evals)


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


def test_sigkill_mid_run_then_resume_loses_no_step_and_no_trace(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "--loop.steps=6")
    _wait_for_steps(run_dir, 2, proc, limit_s=120)
    recorded = sessions(run_dir)
    os.killpg(proc.pid, signal.SIGKILL)  # the engine, gateway and trainer all die at once
    proc.wait(timeout=30)
    assert sessions(run_dir) >= recorded  # every committed trace survived
    resumed = _train(run_dir, "--loop.steps=6", "--resume")
    out, _ = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, out
    assert "resumed at step" in out
    assert steps(run_dir) == [1, 2, 3, 4, 5, 6]  # no duplicate, no gap
    assert sessions(run_dir) > recorded


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
    started = time.monotonic()
    result = subprocess.run(
        _command(run_dir, "--trainer.lr_typo=1", "--loop.steps=-3"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 2
    assert "trainer.lr_typo" in result.stderr and "loop.steps" in result.stderr
    assert not run_dir.exists()
    assert time.monotonic() - started < 20
    resume = subprocess.run(
        _command(run_dir, "--resume"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert resume.returncode == 2 and "no checkpoints" in resume.stderr
