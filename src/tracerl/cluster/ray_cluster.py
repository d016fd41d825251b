"""Connecting to the Ray cluster a run is placed on, and checking up front that it can hold
what the config asks of it.

`connect` joins `cluster.address` (`auto`, a GCS address, `ray://...`) or, unset, starts a
private local cluster on 127.0.0.1 that `disconnect` stops. `check_capacity` compares each
role's reservation with the cluster's totals and names the role that asks for more than there
is, before any actor waits forever for resources. `wait_placed` bounds how long a placement
group may wait, with the same kind of error.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from tracerl.config import ConfigError
from tracerl.config.cluster import ClusterConfig, RoleResources, is_loopback

log = logging.getLogger(__name__)

EXTRA = "pip install 'tracerl[ray]'"
PROBE_TIMEOUT_S = 5.0  # a live head accepts a connection in milliseconds


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"cluster.backend = 'ray' needs Ray, which is not installed: {EXTRA}"
        ) from None
    return ray


def connect(config: ClusterConfig) -> None:
    """Join the cluster, or start a private one."""
    ray = import_ray()
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}
    if config.address is None:
        ray.init(
            address="local",  # a new cluster, never one some other job left running here
            num_cpus=config.num_cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            runtime_env=runtime_env,
            log_to_driver=False,
            configure_logging=False,
        )
        log.info("started a local Ray cluster (%s CPUs)", ray.cluster_resources().get("CPU"))
        return
    _probe(config.address)
    try:
        ray.init(
            address=config.address,
            runtime_env=runtime_env,
            log_to_driver=False,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ConfigError(
            f"cluster.address {config.address!r}: no Ray cluster answers there ({e}); start "
            "one with `ray start --head`, or leave cluster.address unset for a local one"
        ) from None


def _probe(address: str) -> None:
    """A GCS or client address that accepts no connection fails here at once (Ray's own
    connect retries for a minute)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=PROBE_TIMEOUT_S):
            return
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"cluster.address {address!r}: nothing answers there ({e}); start the head with "
            "`ray start --head`, or leave cluster.address unset for a local cluster"
        ) from None


def disconnect() -> None:
    """Detach from the cluster; a private one this process started stops with it."""
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()


def reservation(role: RoleResources) -> dict[str, float]:
    """Ray's resource dict of one actor of `role`."""
    out = {"CPU": role.num_cpus, **role.resources}
    if role.num_gpus:
        out["GPU"] = role.num_gpus
    return {k: v for k, v in out.items() if v}


def check_capacity(asks: dict[str, tuple[int, RoleResources]]) -> None:
    """`ConfigError` naming the role whose actors need more of a resource than the whole
    cluster has (`asks`: role -> (actors, each one's resources)), and the total over roles."""
    ray = import_ray()
    total = ray.cluster_resources()
    needed: dict[str, float] = {}
    for role, (count, resources) in asks.items():
        for key, amount in reservation(resources).items():
            have = float(total.get(key, 0.0))
            if count * amount > have:
                raise ConfigError(
                    f"cluster.{role}: {count} actor(s) x {key} {amount:g} needs {count * amount:g} "
                    f"{key}, the Ray cluster has {have:g} (nodes: {len(ray.nodes())})"
                )
            needed[key] = needed.get(key, 0.0) + count * amount
    for key, amount in needed.items():
        have = float(total.get(key, 0.0))
        if amount > have:
            roles = ", ".join(f"cluster.{r}" for r in asks)
            raise ConfigError(
                f"{roles} together need {amount:g} {key}, the Ray cluster has {have:g}"
            )


def wait_placed(group: Any, role: str, timeout_s: float) -> None:
    """Wait for a placement group, or fail naming the role that could not be placed."""
    ray = import_ray()
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)
        raise ConfigError(
            f"cluster.{role}: Ray could not place {len(group.bundle_specs)} actor(s) of "
            f"{group.bundle_specs[0]} with strategy {getattr(group, 'strategy', '?')} within "
            f"{timeout_s:.0f} s (cluster.ready_timeout_s); the cluster has "
            f"{ray.available_resources()} free"
        )


async def started(
    refs: list[Any], role: str, what: str, resources: RoleResources, timeout_s: float,
    where: str = "",
) -> list[Any]:  # fmt: skip
    """The results of actors' start-up calls `refs`; `ConfigError` naming `cluster.{role}` when
    Ray cannot place them all within `timeout_s`, or one fails to start."""
    ray = import_ray()
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        raise ConfigError(
            f"cluster.{role}: Ray could not place {len(refs)} {what}(s) of "
            f"{reservation(resources)}{f' {where}' if where else ''} within {timeout_s:.0f} s "
            f"(cluster.ready_timeout_s); the cluster has {ray.available_resources()} free"
        )
    try:
        return [await ref for ref in refs]
    except Exception as e:
        raise ConfigError(f"cluster.{role}: a {what} failed to start: {cause(e)}") from None


def reachable_host(bind: str) -> str:
    """The address others reach a server bound to `bind` on this node at: `bind` itself on
    loopback, else the node's IP."""
    if is_loopback(bind):
        return bind
    ray = import_ray()
    return str(ray.util.get_node_ip_address())


def cpu_threads(role: RoleResources) -> int:
    """Torch threads for an actor: its reserved CPUs (at least one), never more than the
    machine's."""
    return max(1, min(int(role.num_cpus), os.cpu_count() or 1))


def cause(e: BaseException) -> str:
    """The last line of a Ray error: the remote exception's own message."""
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__
