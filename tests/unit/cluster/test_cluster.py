"""What needs no Ray: the `[cluster]` config's rules, the error without Ray installed, and the
what-runs-where record `tracerl cluster status` prints."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tracerl.cluster import status
from tracerl.config import ConfigError, TrainCommandConfig


def test_ranks_need_ray_and_a_batch_that_gives_each_rank_a_trajectory() -> None:
    with pytest.raises(ValueError, match="cluster.trainer.ranks is 2 but cluster.backend is"):
        TrainCommandConfig.model_validate({"cluster": {"trainer": {"ranks": 2}}})
    with pytest.raises(ValueError, match=r"ranks \(16\) is above orchestrator.batch_size \(8\)"):
        TrainCommandConfig.model_validate(
            {
                "cluster": {"backend": "ray", "trainer": {"ranks": 16}},
                "orchestrator": {"batch_size": 8, "group_size": 4},
            }
        )
    config = TrainCommandConfig.model_validate(
        {"cluster": {"backend": "ray", "trainer": {"ranks": 2, "resources": {"gpu_node": 1}}}}
    )
    assert config.cluster.trainer.resources == {"gpu_node": 1.0}
    with pytest.raises(ValueError, match="trainer.lora is set with cluster.trainer.ranks = 2"):
        TrainCommandConfig.model_validate(
            {"cluster": {"backend": "ray", "trainer": {"ranks": 2}}, "trainer": {"lora": {}}}
        )


def test_without_ray_installed_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracerl.cluster.ray_cluster import connect

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    config = TrainCommandConfig.model_validate({"cluster": {"backend": "ray"}})
    with pytest.raises(ConfigError, match=r"needs Ray, which is not installed: pip install 'tr"):
        connect(config.cluster)


def fake_pool() -> Any:
    class Launcher:
        def __init__(self) -> None:
            self.placement = {"node_id": "node-b" * 4, "pid": 41, "actor_pid": 40}

        def alive(self) -> bool:
            return False

    members = [
        SimpleNamespace(
            name="launched-0", engine=SimpleNamespace(base_url="http://127.0.0.1:9"),
            launcher=Launcher(), active=False, restarting=True, weight_version=3,
        ),
        SimpleNamespace(
            name="local", engine=object(), launcher=None, active=True, restarting=False,
            weight_version=4,
        ),
    ]  # fmt: skip
    return SimpleNamespace(members=members, counters={"restarts": 2})


def test_the_record_says_what_runs_where(tmp_path: Path) -> None:
    trainer = SimpleNamespace(
        placement=[
            {"rank": 0, "node_id": "node-a" * 4, "pid": 10, "device": "cpu"},
            {"rank": 1, "node_id": "node-a" * 4, "pid": 11, "device": "cpu"},
        ]
    )
    record = status.snapshot("ray", trainer, fake_pool())
    status.write(tmp_path, record)
    assert status.read(tmp_path) == record
    assert status.gauges(record) == {
        "cluster/trainer_ranks": 2.0,
        "cluster/engines": 2.0,
        "cluster/engines_active": 1.0,
        "cluster/engine_restarts": 2.0,
        "cluster/gateways": 0.0,
        "cluster/agent_workers": 0.0,
        "cluster/agent_worker_restarts": 0.0,
        "cluster/episodes_replayed": 0.0,
    }
    text = status.render(record)
    assert "trainer: 2 rank(s)" in text and "rank 1  node node-anode-a  pid 11  cpu" in text
    assert "engines: 1/2 in rotation, 2 restart(s)" in text
    assert "launched-0  http://127.0.0.1:9  restarting  v3  node node-bnode-b  pid 41" in text
    assert "local  in process  in rotation  v4  node this machine  pid -" in text
    # a local trainer: this process
    local = status.snapshot("local", SimpleNamespace(device="cpu"), fake_pool())
    assert local["trainer_ranks"][0]["node_id"] is None


def test_a_directory_without_a_record_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cluster.json does not exist: not a run"):
        status.read(tmp_path)


def test_engines_beyond_this_machine_need_a_key_that_is_never_written_out() -> None:
    with pytest.raises(ValueError, match=r"cluster.bind is '0.0.0.0': engines reachable beyond"):
        TrainCommandConfig.model_validate({"cluster": {"backend": "ray", "bind": "0.0.0.0"}})
    config = TrainCommandConfig.model_validate(
        {"cluster": {"backend": "ray", "bind": "0.0.0.0"}, "engine": {"api_key": "s3cret-key"}}
    )
    assert "s3cret-key" not in config.model_dump_json() and "s3cret-key" not in repr(config)
    assert config.engine.api_key is not None
    assert config.engine.api_key.get_secret_value() == "s3cret-key"


def test_cpus_are_set_only_for_a_private_cluster() -> None:
    with pytest.raises(ValueError, match="cluster.num_cpus sizes a private local cluster"):
        TrainCommandConfig.model_validate(
            {"cluster": {"backend": "ray", "address": "auto", "num_cpus": 4}}
        )


def test_gateways_and_agent_workers_are_actors_of_a_ray_run() -> None:
    for role in ({"gateways": {"count": 2}}, {"agents": {"workers": 3}}):
        with pytest.raises(ValueError, match=r"but cluster.backend is 'local': these actors"):
            TrainCommandConfig.model_validate({"cluster": role})
    config = TrainCommandConfig.model_validate(
        {
            "cluster": {
                "backend": "ray",
                "gateways": {"count": 2},
                "agents": {"workers": 3, "resources": {"cpu_node": 1}},
            }
        }
    )
    assert config.cluster.weight_sync == "object_store"
    assert config.cluster.agents.resources == {"cpu_node": 1.0}


def test_the_record_lists_gateways_and_agent_workers() -> None:
    trainer = SimpleNamespace(device="cpu")
    record = status.snapshot("ray", trainer, fake_pool())
    actors = SimpleNamespace(
        actors=object(), records=[{"url": "http://10.0.0.2:81", "node_id": "n" * 12, "pid": 7}]
    )
    workers = SimpleNamespace(
        restarts=1,
        records=lambda: [{"index": 0, "inflight": 3, "node_id": "w" * 12, "pid": 9}],
    )
    record.update(status.places(actors, workers, {"episodes_replayed": 2, "gateways_lost": 1}))
    gauges = status.gauges(record)
    assert gauges["cluster/gateways"] == 0.0  # one placed, one lost
    assert gauges["cluster/agent_workers"] == 1.0
    assert gauges["cluster/agent_worker_restarts"] == 1.0
    assert gauges["cluster/episodes_replayed"] == 2.0
    text = status.render(record)
    assert "gateways: 1, 1 lost" in text and "http://10.0.0.2:81  actor  node nnnnnnnnnnnn" in text
    assert "agent workers: 1, 1 replaced, 2 episode(s) replayed" in text
    assert "worker 0  node wwwwwwwwwwww  pid 9  3 in flight" in text
    # the gateway in the driver
    driver = SimpleNamespace(actors=None, urls=["http://127.0.0.1:5"])
    assert status.places(driver, None, {})["gateways"][0]["actor"] is False
