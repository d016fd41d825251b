"""Placement on a cluster of two nodes (a head and a `ray start --address` node on this
machine, each with its own CPUs and custom resources): the trainer ranks go where
`cluster.trainer.resources` says, the engines where `cluster.engines.resources` says, and the
agent workers where `cluster.agents.resources` says; a gateway actor serves them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import Run, TwoNodes

pytestmark = pytest.mark.ray


def test_roles_are_placed_on_the_nodes_their_resources_name(
    tmp_path: Path, runs: Callable[..., Run], two_nodes: TwoNodes
) -> None:
    run = runs(
        tmp_path / "run",
        "--loop.steps=2",
        "--cluster.backend=ray",
        f"--cluster.address={two_nodes.address}",
        "--cluster.trainer.ranks=2",
        "--cluster.trainer.resources.trainer_node=1",
        "--engine.count=2",
        "--cluster.engines.resources.engine_node=1",
        "--cluster.agents.workers=2",
        "--cluster.agents.num_cpus=0.5",
        "--cluster.agents.resources.cpu_node=1",
        "--cluster.gateways.count=1",
        env=two_nodes.env,
    )
    assert run.wait() == 0, run.output()
    record = run.cluster()
    assert [w["node_id"] for w in record["agent_workers"]] == [two_nodes.node_with("cpu_node")] * 2
    assert [g["actor"] for g in record["gateways"]] == [True]
    trainer_node, engine_node = (
        two_nodes.node_with("trainer_node"),
        two_nodes.node_with("engine_node"),
    )
    assert trainer_node != engine_node
    assert [r["node_id"] for r in record["trainer_ranks"]] == [trainer_node] * 2
    assert [e["node_id"] for e in record["engines"]] == [engine_node] * 2


def test_a_role_asking_for_what_no_node_has_fails_naming_it(
    tmp_path: Path, runs: Callable[..., Run], two_nodes: TwoNodes
) -> None:
    run = runs(
        tmp_path / "run",
        "--cluster.backend=ray",
        f"--cluster.address={two_nodes.address}",
        "--cluster.trainer.ranks=3",
        "--cluster.trainer.resources.trainer_node=1",
        env=two_nodes.env,
    )
    assert run.wait() != 0
    assert "cluster.trainer: 3 actor(s) x trainer_node 1 needs 3 trainer_node" in run.output()
