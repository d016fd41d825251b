"""What runs where: a run's trainer ranks, engines, gateways and agent workers, written to
`RUN_DIR/cluster.json` at start-up and after every step, and read back by `tracerl cluster
status RUN_DIR`.

The record is the run's own view (the ranks it formed, the engines its pool launched or
attached, which of them are in rotation, on which node and process), so it reads the same for a
local run and for one on Ray, while the run is going and after it ended.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

FILE = "cluster.json"


def snapshot(backend: str, trainer: Any, pool: Any) -> dict[str, Any]:
    """The record of `trainer` (a `Trainer` or a `RayTrainer`) and `pool`'s engines now."""
    ranks = getattr(trainer, "placement", None) or [
        {"rank": 0, "node_id": None, "pid": os.getpid(), "device": str(trainer.device)}
    ]
    engines = []
    for member in pool.members:
        launcher = member.launcher
        placement = getattr(launcher, "placement", {}) if launcher is not None else {}
        pid = getattr(launcher, "pid", None) if launcher is not None else None
        alive = launcher.alive() if launcher is not None else None
        engines.append(
            {
                "name": member.name,
                "url": getattr(member.engine, "base_url", None),
                "active": member.active,
                "alive": alive,
                "restarting": member.restarting,
                "weight_version": member.weight_version,
                "node_id": placement.get("node_id"),
                "pid": placement.get("pid", pid),
                "actor_pid": placement.get("actor_pid"),
                "launched": launcher is not None,
            }
        )
    return {
        "backend": backend,
        "updated": time.time(),
        "trainer_ranks": ranks,
        "engines": engines,
        "restarts": int(pool.counters.get("restarts", 0)),
    }


def places(gateways: Any, agent_workers: Any, runner_counters: Any) -> dict[str, Any]:
    """The record's gateways and agent workers (`tracerl.run.gateways`), and the episodes
    their losses made the runner play again."""
    if gateways.actors is not None:
        listed = [{**g, "actor": True} for g in gateways.records]
    else:
        listed = [{"url": url, "node_id": None, "pid": os.getpid(), "actor": False}
                  for url in gateways.urls]  # fmt: skip
    return {
        "gateways": listed,
        "gateways_lost": int(runner_counters.get("gateways_lost", 0)),
        "agent_workers": agent_workers.records() if agent_workers is not None else [],
        "agent_worker_restarts": agent_workers.restarts if agent_workers is not None else 0,
        "episodes_replayed": int(runner_counters.get("episodes_replayed", 0)),
    }


def write(run_dir: Path, record: dict[str, Any]) -> None:
    """Replace `RUN_DIR/cluster.json` atomically (a reader never sees half of it)."""
    tmp = run_dir / f".{FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(run_dir / FILE)


def gauges(record: dict[str, Any]) -> dict[str, float]:
    """The metrics line's view: how many ranks and engines are alive."""
    engines = record["engines"]
    return {
        "cluster/trainer_ranks": float(len(record["trainer_ranks"])),
        "cluster/engines": float(len(engines)),
        "cluster/engines_active": float(sum(1 for e in engines if e["active"])),
        "cluster/engine_restarts": float(record["restarts"]),
        "cluster/gateways": float(len(record.get("gateways", [])) - record.get("gateways_lost", 0)),
        "cluster/agent_workers": float(len(record.get("agent_workers", []))),
        "cluster/agent_worker_restarts": float(record.get("agent_worker_restarts", 0)),
        "cluster/episodes_replayed": float(record.get("episodes_replayed", 0)),
    }


def render(record: dict[str, Any]) -> str:
    """The record as the table `tracerl cluster status` prints."""
    age = time.time() - float(record["updated"])
    lines = [f"backend {record['backend']}, updated {age:.0f} s ago"]
    lines.append(f"trainer: {len(record['trainer_ranks'])} rank(s)")
    for r in record["trainer_ranks"]:
        node = (r.get("node_id") or "this machine")[:12]
        lines.append(f"  rank {r['rank']}  node {node}  pid {r['pid']}  {r['device']}")
    active = sum(1 for e in record["engines"] if e["active"])
    lines.append(
        f"engines: {active}/{len(record['engines'])} in rotation, {record['restarts']} restart(s)"
    )
    for e in record["engines"]:
        state = "in rotation" if e["active"] else "out"
        if e["restarting"]:
            state = "restarting"
        node = (e.get("node_id") or "this machine")[:12]
        lines.append(
            f"  {e['name']}  {e['url'] or 'in process'}  {state}  v{e['weight_version']}  "
            f"node {node}  pid {e['pid'] if e['pid'] is not None else '-'}"
        )
    lines.append(
        f"gateways: {len(record.get('gateways', []))}, {record.get('gateways_lost', 0)} lost"
    )
    for g in record.get("gateways", []):
        node = (g.get("node_id") or "this machine")[:12]
        kind = "actor" if g.get("actor") else "in the driver"
        lines.append(f"  {g['url']}  {kind}  node {node}  pid {g['pid']}")
    workers = record.get("agent_workers", [])
    if workers:
        lines.append(
            f"agent workers: {len(workers)}, {record.get('agent_worker_restarts', 0)} "
            f"replaced, {record.get('episodes_replayed', 0)} episode(s) replayed"
        )
        for w in workers:
            node = (w.get("node_id") or "starting")[:12]
            lines.append(
                f"  worker {w['index']}  node {node}  pid {w.get('pid', '-')}  "
                f"{w['inflight']} in flight"
            )
    return "\n".join(lines)


def read(run_dir: Path) -> dict[str, Any]:
    path = run_dir / FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: not a run directory, or a run that has not started yet"
        )
    record: dict[str, Any] = json.loads(path.read_text())
    return record
