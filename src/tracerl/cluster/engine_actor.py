"""Engine servers as Ray actors: each actor launches one `engine.backend` server on its node
(the same command and readiness check as a server launched on this machine,
`tracerl.rollout.backends.process_launcher`) and lives as long as it.

`RayEngineLauncher` is the pool's `EngineLauncher` for one of them: `start` places a fresh
actor and returns its server's URL once it has generated a token; `alive` is false once the
server has exited or the actor has died (killed, or its node lost). The pool then does what it
does for any launched engine: takes it out of rotation, resumes its requests elsewhere, and
replaces it (`stop`, then `start`: a new actor) at the current weights. The server dies with
its actor (the launcher's parent-death signal), so killing an actor leaves no server behind.

Weights reach the server through its actor (`load_weights`, which the pool calls in place of
the server's `update_weights_from_disk`): a package from the object store is written to the
actor's node (`tracerl.cluster.weights`) and loaded from there; a path is loaded as it is. A
LoRA adapter goes the same way (`load_adapter`, in place of the server's `load_lora_adapter`),
each version into a directory of its own on the node (the newest three kept: a vLLM server
may read one it still runs requests on again).

The server listens on 127.0.0.1 of its node. With `engine.api_key` set the actor also serves a
`KeyedProxy` on `cluster.bind` that requires the key, and that is the URL the pool gets;
`cluster.bind` beyond loopback needs the key, so no engine is reachable from another machine
without it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from tracerl.cluster.ray_cluster import cause, import_ray, reachable_host
from tracerl.cluster.weights import Package, WeightsChannel
from tracerl.config.cluster import RoleResources, is_loopback
from tracerl.config.engine import EngineConfig

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
"""How long a stopped actor may take to stop its server before it is killed."""


class EngineServer:
    """One engine server and its supervision (a Ray actor)."""

    def __init__(self) -> None:
        self.launcher: Any = None
        self.proxy: Any = None
        self.client: Any = None  # the server's own, on 127.0.0.1 (never through the proxy)
        self.scratch: Path | None = None

    async def start(
        self,
        config: dict[str, Any],
        model_dir: str,
        log_path: str,
        name: str,
        bind: str,
        api_key: str | None,
    ) -> str:
        """The server's URL once it has generated a token: on 127.0.0.1, or, with a key, the
        keyed proxy's on `bind` (this node's address when that is beyond loopback)."""

        from tracerl.cluster.keyed_proxy import KeyedProxy
        from tracerl.rollout.backends import client_for, process_launcher

        engine = EngineConfig.model_validate({**config, "api_key": None})  # the server has none

        def make(url: str) -> Any:
            return client_for(engine, url, engine.ready_timeout_s)

        self.launcher = process_launcher(engine, Path(model_dir), Path(log_path), name, make)
        url: str = await self.launcher.start()
        self.client = make(url)
        if not api_key:
            if not is_loopback(bind):
                raise ValueError(f"cluster.bind {bind!r} needs engine.api_key")
            return url
        self.proxy = KeyedProxy(url, api_key)
        port = await self.proxy.start(bind)
        return f"http://{reachable_host(bind)}:{port}"

    async def load_weights(self, source: Package | str, version: int) -> None:
        """Load `source` into the server: a weights package (written to this node first) or
        a directory path."""
        from tracerl.cluster.weights import scratch_dir, unpack

        if isinstance(source, Package):
            if self.scratch is None:
                self.scratch = scratch_dir()
            path = str(await asyncio.to_thread(unpack, source, self.scratch / "weights"))
        else:
            path = source
        await self.client.update_weights_from_disk(path, version)

    async def load_adapter(self, source: Package | str, name: str, version: int) -> None:
        """Load version `version` of LoRA adapter `name` into the server: a package (written
        to this node first) or a directory path."""
        from tracerl.cluster.weights import scratch_dir, unpack

        path = source
        if isinstance(source, Package):
            if self.scratch is None:
                self.scratch = scratch_dir()
            root = self.scratch / "adapters"
            path = str(await asyncio.to_thread(unpack, source, root / str(version)))
            for old in sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())[:-3]:
                shutil.rmtree(root / str(old), ignore_errors=True)
        await self.client.load_lora_adapter(name, path, version)

    async def wait(self) -> int | None:
        """Returns when the server exits (its exit code)."""
        process = self.launcher.process
        return int(await process.wait()) if process is not None else None

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.close()
        if self.client is not None and hasattr(self.client, "close"):
            await self.client.close()
        if self.launcher is not None:
            await self.launcher.stop()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def where(self) -> dict[str, Any]:
        """The node, the server's process and this actor's."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return {"node_id": node, "pid": self.launcher.pid, "actor_pid": os.getpid()}


class RayEngineLauncher:
    """The pool's launcher of engine `index` as a Ray actor (see the module docstring)."""

    def __init__(
        self,
        config: EngineConfig,
        resources: RoleResources,
        model_dir: Path,
        log_path: Path,
        index: int,
        bind: str = "127.0.0.1",
        weights: WeightsChannel | None = None,
    ) -> None:
        """`weights`: the run's object-store weights, which `load_weights` resolves."""
        self.config = config
        self.weights = weights or WeightsChannel()
        self.bind = bind
        self.resources = resources
        self.model_dir = model_dir
        self.log_path = log_path
        self.name = f"{config.backend} engine {index} (Ray actor)"
        self.ready_timeout_s = config.ready_timeout_s
        self.actor: Any = None
        self.exited: Any = None
        self.placement: dict[str, Any] = {}

    async def start(self) -> str:
        ray = import_ray()
        r = self.resources
        self.actor = (
            ray.remote(EngineServer)
            .options(
                num_cpus=r.num_cpus,
                num_gpus=r.num_gpus,
                resources=dict(r.resources),
                max_restarts=0,
                max_concurrency=8,  # wait runs throughout; start/load/stop/where beside it
            )
            .remote()
        )
        key = self.config.api_key.get_secret_value() if self.config.api_key else None
        args = (self.config.model_dump(mode="json"), str(self.model_dir), str(self.log_path))
        try:
            url: str = await self.actor.start.remote(*args, self.name, self.bind, key)
        except Exception as e:
            await self.stop()
            from tracerl.rollout.launcher import EngineStartError

            raise EngineStartError(f"{self.name}: {cause(e)}") from None
        self.exited = self.actor.wait.remote()
        self.placement = await self.actor.where.remote()
        return url

    async def load_weights(self, path: str, version: int) -> None:
        """Bring the server to `version` from `path` (an object-store package's name, or a
        directory on the actor's node), through its actor."""
        from tracerl.engine.types import WeightLoadError

        if self.actor is None:
            raise WeightLoadError(f"{self.name} is not running")
        try:
            await self.actor.load_weights.remote(self.weights.resolve(path), version)
        except Exception as e:
            raise WeightLoadError(f"{self.name}: loading v{version} failed: {cause(e)}") from e

    async def load_adapter(self, name: str, path: str, version: int) -> None:
        """Bring the server's LoRA adapter `name` to `version` from `path` (an object-store
        package's name, or a directory on the actor's node), through its actor."""
        from tracerl.engine.types import WeightLoadError

        if self.actor is None:
            raise WeightLoadError(f"{self.name} is not running")
        try:
            await self.actor.load_adapter.remote(self.weights.resolve(path), name, version)
        except Exception as e:
            raise WeightLoadError(
                f"{self.name}: loading adapter v{version} failed: {cause(e)}"
            ) from e

    async def stop(self) -> None:
        if self.actor is None:
            return
        ray = import_ray()
        actor, self.actor, self.exited = self.actor, None, None
        try:
            ref = actor.stop.remote()
            ready, _ = ray.wait([ref], timeout=STOP_TIMEOUT_S)
            if ready:
                ray.get(ready[0])
        except Exception as e:  # a dead actor has nothing left to stop; it is killed below
            log.info("%s: stop failed (%s); killing the actor", self.name, cause(e))
        ray.kill(actor, no_restart=True)

    def alive(self) -> bool:
        if self.actor is None or self.exited is None:
            return False
        ray = import_ray()
        done, _ = ray.wait([self.exited], timeout=0)
        return not done
