"""`tracerl bench concurrency` on a small workload: the harness runs every configuration on the
virtual clock and reports figures that respond to the cap; workload files are validated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.bench.concurrency import Workload, load_workloads, run_workload, settled_step

SMALL = {
    "name": "small",
    "engines": 1,
    "kv_cache_tokens": 20_000,
    "output_median": 40.0,
    "batch_size": 16,
    "group_size": 4,
    "steps": 5,
    "measure_from": 2,
}


def test_a_small_workload_runs_every_configuration() -> None:
    line = run_workload(Workload.from_json(SMALL, "test"))
    runs = {r["config"]: r for r in line["runs"]}
    assert set(runs) == {
        "fixed_16",
        "fixed_64",
        "fixed_256",
        "fixed_1024",
        "adaptive_low",
        "adaptive_high",
        "adaptive_bootstrap",
    }
    # the engine is far from full at 16: more in flight is more throughput
    assert runs["fixed_64"]["tokens_per_s"] > 1.5 * runs["fixed_16"]["tokens_per_s"]
    assert all(len(runs[a]["caps"]) == 5 for a in line["adaptive"])
    assert runs["adaptive_high"]["caps"][0] <= 1024
    assert isinstance(line["target_met"], bool)
    json.dumps(line)  # one JSON line


def test_settling_is_measured_against_the_steady_state_range() -> None:
    assert settled_step([16, 60, 200, 400, 320, 400, 330, 410], measure_from=4) == 4
    assert settled_step([16, 60, 200, 400, 800, 1600], measure_from=2) is None  # still growing


def test_workload_files_are_validated(tmp_path: Path) -> None:
    good = tmp_path / "w.json"
    good.write_text(json.dumps([SMALL, {**SMALL, "name": "b", "turns": [2, 3]}]))
    assert [w.turns for w in load_workloads(str(good))] == [(1, 1), (2, 3)]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**SMALL, "engins": 2}))
    with pytest.raises(ValueError, match="engins"):
        load_workloads(str(bad))
    bad.write_text(json.dumps({**SMALL, "group_size": 5}))
    with pytest.raises(ValueError, match="divisible"):
        load_workloads(str(bad))
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load_workloads(str(bad))
