"""`tracerl train examples/tiny.toml --cluster.backend=ray`: 2 trainer ranks (FSDP2 over gloo)
and 2 engine servers as Ray actors (weights through the object store), against the same run in
one process; gateways and agent workers as actors; and what happens when an engine actor, an
agent worker or a trainer rank dies, or the driver is interrupted."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import RAY_ARGS, Run, until_gone

pytestmark = pytest.mark.ray

STEPS = 3
# on a line once the metrics collector has polled the engines twice, which depends on timing
POLLED = {"engine/generation_tokens_per_s"}


# two gateways and two agent workers beside the ranks and engines, in the same 6 logical CPUs
ACTORS = [
    "--cluster.gateways.count=2",
    "--cluster.gateways.num_cpus=0.5",
    "--cluster.agents.workers=2",
    "--cluster.agents.num_cpus=0.5",
]


def metric_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def trained_sessions(run_dir: Path) -> int:
    with sqlite3.connect(run_dir / "traces.sqlite") as db:
        return int(db.execute("SELECT COUNT(DISTINCT session_id) FROM turns").fetchone()[0])


def checkpoint_files(run_dir: Path) -> dict[str, set[str]]:
    return {
        step.name: {str(p.relative_to(step)) for p in step.rglob("*") if p.is_file()}
        for step in sorted((run_dir / "checkpoints").iterdir())
    }


def test_a_run_on_ray_has_the_shape_of_the_local_run(
    tmp_path: Path, runs: Callable[..., Run]
) -> None:
    local = runs(tmp_path / "local", f"--loop.steps={STEPS}")
    assert local.wait() == 0, local.output()
    ray_run = runs(tmp_path / "ray", f"--loop.steps={STEPS}", *RAY_ARGS)
    assert ray_run.wait() == 0, ray_run.output()

    local_lines, ray_lines = metric_lines(local.run_dir), metric_lines(ray_run.run_dir)
    assert [m["step"] for m in ray_lines] == [m["step"] for m in local_lines] == [1, 2, 3]
    for ours, theirs in zip(ray_lines, local_lines, strict=True):
        assert ours.keys() - POLLED == theirs.keys() - POLLED
    assert {m["perf/trainer_ranks"] for m in ray_lines} == {2.0}
    assert {m["cluster/engines_active"] for m in ray_lines} == {2.0}
    # the weight probe passed after every push: both engines, the object store, 2 shards
    assert all(m["weights/probe_logprob_diff"] < 2e-4 for m in ray_lines + local_lines)
    assert trained_sessions(ray_run.run_dir) >= STEPS * 8  # batch_size 8 per step
    # the same checkpoints, whichever rank count wrote them (DCP shards: one file per rank)
    ray_ckpt, local_ckpt = checkpoint_files(ray_run.run_dir), checkpoint_files(local.run_dir)
    assert ray_ckpt.keys() == local_ckpt.keys()
    for name, files in local_ckpt.items():
        shards = {f for f in ray_ckpt[name] if f.endswith(".distcp")}
        assert ray_ckpt[name] - shards == files - {f for f in files if f.endswith(".distcp")}
        assert len(shards) == 2
    assert not (ray_run.run_dir / "weights").exists()  # weights went through the object store
    record = ray_run.cluster()
    assert record["backend"] == "ray" and len(record["trainer_ranks"]) == 2
    assert [e["active"] for e in record["engines"]] == [True, True]
    # every process the run placed is gone with it
    pids = [r["pid"] for r in record["trainer_ranks"]]
    pids += [e[k] for e in record["engines"] for k in ("pid", "actor_pid")]
    assert until_gone(pids) == []


def test_a_lora_run_on_ray_sends_its_adapter_through_the_object_store(
    tmp_path: Path, runs: Callable[..., Run]
) -> None:
    """LoRA on one trainer rank, two engine actors: each step's adapter alone goes through
    the object store to both engines, which pass the probe; nothing is written for them in the
    run directory; the traces name the adapter."""
    lora = ["--trainer.lora.rank=4", "--cluster.trainer.ranks=1"]
    run = runs(tmp_path / "run", f"--loop.steps={STEPS}", *RAY_ARGS, *lora)
    assert run.wait() == 0, run.output()
    lines = metric_lines(run.run_dir)
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert all(m["weights/probe_logprob_diff"] < 2e-4 for m in lines)
    assert all(0 < m["weights/sync_bytes"] < 1e6 for m in lines)  # an adapter, not the model
    assert not (run.run_dir / "weights").exists() and not (run.run_dir / "adapters").exists()
    assert [e["weight_version"] for e in run.cluster()["engines"]] == [STEPS, STEPS]
    with sqlite3.connect(run.run_dir / "traces.sqlite") as db:
        turns = [json.loads(data) for (data,) in db.execute("SELECT data FROM turns")]
    assert {t["adapter"] for t in turns if t["weight_version"] >= 1} == {"run"}


def test_an_engine_actor_killed_mid_run_is_replaced_and_no_episode_is_lost(
    tmp_path: Path, runs: Callable[..., Run]
) -> None:
    steps = 40  # enough steps of the tiny loop (~1 s each) to outlast the replacement
    run = runs(tmp_path / "run", f"--loop.steps={steps}", *RAY_ARGS, *ACTORS)
    run.until(lambda: run.steps() >= 1, "a first step")
    victim = run.cluster()["engines"][0]
    os.kill(victim["actor_pid"], signal.SIGKILL)  # the actor's process, as a lost node's
    assert until_gone([victim["pid"]]) == []  # its server went with it
    run.until(lambda: run.cluster()["restarts"] >= 1, "the engine replaced")
    assert run.wait() == 0, run.output()
    record = run.cluster()
    assert [e["active"] for e in record["engines"]] == [True, True]
    assert record["engines"][0]["actor_pid"] != victim["actor_pid"]  # a new actor
    # the gateway actors were handed the new engine's URL, and route to both engines
    urls = [e["url"] for e in record["engines"]]
    assert victim["url"] not in urls
    assert [sorted(g["engines"]) for g in record["gateways"]] == [sorted(urls)] * 2
    assert record["engines"][0]["weight_version"] == steps  # given every step's weights since
    assert [m["step"] for m in metric_lines(run.run_dir)] == list(range(1, steps + 1))
    failed = run.run_dir / "episodes_failed.jsonl"
    assert not failed.exists() or failed.read_text() == "", failed.read_text()


def test_a_killed_agent_worker_is_replaced_and_its_episode_played_again(
    tmp_path: Path, runs: Callable[..., Run]
) -> None:
    steps = 30
    run = runs(tmp_path / "run", f"--loop.steps={steps}", *RAY_ARGS, *ACTORS)
    run.until(lambda: run.steps() >= 1, "a first step")
    record = run.cluster()
    assert [g["actor"] for g in record["gateways"]] == [True, True]
    victim = record["agent_workers"][0]
    os.kill(victim["pid"], signal.SIGKILL)
    run.until(lambda: run.cluster()["agent_worker_restarts"] >= 1, "the agent worker replaced")
    assert run.wait() == 0, run.output()
    record = run.cluster()
    assert record["episodes_replayed"] >= 1
    assert record["agent_workers"][0]["pid"] != victim["pid"]
    assert [m["step"] for m in metric_lines(run.run_dir)] == list(range(1, steps + 1))
    failed = run.run_dir / "episodes_failed.jsonl"
    assert not failed.exists() or failed.read_text() == "", failed.read_text()
    # both gateways recorded turns into the run's one store
    assert trained_sessions(run.run_dir) >= steps * 8


def test_a_killed_trainer_rank_stops_the_run_and_resume_continues(
    tmp_path: Path, runs: Callable[..., Run]
) -> None:
    run = runs(tmp_path / "run", "--loop.steps=4", *RAY_ARGS)
    run.until(lambda: run.steps() >= 1, "a first step")
    rank = run.cluster()["trainer_ranks"][1]
    os.kill(rank["pid"], signal.SIGKILL)
    code = run.wait()
    assert code not in (0, 130), run.output()
    assert "trainer rank 1 failed" in run.output(), run.output()
    done = run.steps()
    assert done < 4
    resumed = runs(run.run_dir, "--resume", "--loop.steps=4", *RAY_ARGS)
    assert resumed.wait() == 0, resumed.output()
    steps = [m["step"] for m in metric_lines(run.run_dir)]
    assert steps == list(range(1, 5)), steps


def test_with_a_key_every_engine_requires_it(tmp_path: Path, runs: Callable[..., Run]) -> None:
    key = "engine-key-" + "q" * 24
    run = runs(
        tmp_path / "run",
        "--loop.steps=20",
        *RAY_ARGS,
        f"--engine.api_key={key}",
        "--cluster.weight_sync=disk",  # the servers load RUN_DIR/weights themselves
    )
    run.until(lambda: run.steps() >= 1, "a first step")
    urls = [e["url"] for e in run.cluster()["engines"]]
    assert all(u.startswith("http://127.0.0.1:") for u in urls)  # the keyed proxies
    for url in urls:
        for headers, status in (({}, 401), ({"Authorization": f"Bearer {key}"}, 200)):
            request = urllib.request.Request(url + "/health", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    got = resp.status
            except urllib.error.HTTPError as e:
                got = e.code
            assert got == status, (url, headers)
    assert run.wait() == 0, run.output()
    assert [m["step"] for m in metric_lines(run.run_dir)] == list(range(1, 21))
    assert (run.run_dir / "weights" / "model.safetensors").is_file()
    # never written out: the resolved config holds a mask
    assert key not in run.output() and key not in (run.run_dir / "config.json").read_text()
    assert "**********" in (run.run_dir / "config.json").read_text()


def test_ctrl_c_stops_every_actor_and_server(tmp_path: Path, runs: Callable[..., Run]) -> None:
    run = runs(tmp_path / "run", "--loop.steps=50", *RAY_ARGS, *ACTORS)
    run.until(lambda: run.steps() >= 1, "a first step")
    record = run.cluster()
    os.killpg(run.process.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    assert run.wait() == 130, run.output()
    pids = [r["pid"] for r in record["trainer_ranks"]]
    pids += [e[k] for e in record["engines"] for k in ("pid", "actor_pid")]
    pids += [a["pid"] for a in (*record["gateways"], *record["agent_workers"])]
    assert len(pids) == 2 + 4 + 2 + 2
    assert until_gone(pids) == []
    assert (run.run_dir / "checkpoints").is_dir()
