"""Gateways as Ray actors (`cluster.gateways.count`): each actor serves the same gateway the
driver would (`tracerl.gateway.server.Gateway`, the run's admin key and system prompt) on
`cluster.bind` of its node, in front of an engine pool of its own attached to the run's engine
servers, and records into the run's one trace store (the SQLite file, or PostgreSQL), from which
the driver reads every turn once. With `[telemetry]` on, each actor exports its own request and
generation spans (a `Telemetry` of its own, built from the config it is given, flushed at stop).

The driver's pool still owns the engines (launch, health, restarts, weight sync); the actors'
pools only route and fail over. An engine an actor's pool loses is retried elsewhere, resuming
from the tokens it had; when the driver's pool replaces an engine (a new actor, a new URL),
`RayGateways.follow` hands every gateway the new set of URLs. A weight sync pauses the servers
themselves, so the gateways' requests wait or resume on the new weights like the driver's.

With the SQLite store the actors run on the driver's node: the file is that machine's. A
gateway that dies is not replaced: the episodes it was serving fail with their reason (their
turns so far are in the store), and the loop opens new sessions on the gateways that answer
(`tracerl.run.rollouts.EpisodeRunner`); with none left, every episode fails and says why.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.cluster.ray_cluster import import_ray, reachable_host, started
from tracerl.config.cluster import GatewaysConfig
from tracerl.config.engine import EngineConfig
from tracerl.config.pool import PoolConfig
from tracerl.config.telemetry import TelemetryConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rendering:
    """How a gateway actor renders sessions: the run's system prompt, `history`, the text of
    `trainer.chat_template` (read on the driver, whose file it names), `chat_format` and
    whether turns record a MoE model's routed experts (`trainer.moe.routing = "replay"`)."""

    system_prompt: str | None = None
    history: str = "extend"
    chat_template: str | None = None
    chat_format: str = "auto"
    record_routed_experts: bool = True


class GatewayServer:
    """One gateway, its engine pool and its store connection (a Ray actor)."""

    def __init__(self) -> None:
        self.pool: Any = None
        self.store: Any = None
        self.runner: Any = None
        self.telemetry: Any = None

    async def start(
        self,
        engine: EngineConfig,
        pool: PoolConfig,
        urls: list[str],
        store: str,
        admin_key: str,
        rendering: Rendering,
        bind: str,
        telemetry: TelemetryConfig | None = None,
    ) -> str:
        """The gateway's URL once it serves (this node's address when `bind` is beyond
        loopback); `telemetry`: where its spans go (unset: off)."""
        from transformers import AutoTokenizer

        from tracerl.engine.server import start_server
        from tracerl.gateway.server import Gateway
        from tracerl.gateway.store import open_store
        from tracerl.models import resolve_model
        from tracerl.rollout.backends import start_pool
        from tracerl.telemetry import start_telemetry

        self.telemetry = start_telemetry(telemetry)
        model_dir = resolve_model(engine.model)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if rendering.chat_template is not None:
            tokenizer.chat_template = rendering.chat_template
        attached = engine.model_copy(update={"urls": urls})
        self.pool = await start_pool(
            attached, model_dir, Path(tempfile.gettempdir()), pool, telemetry=self.telemetry
        )
        self.store = await open_store(store)
        info = await self.pool.model_info()
        gateway = Gateway(
            self.pool,
            tokenizer,
            self.store,
            model_name=engine.model,
            eos_ids=set(info.get("eos_token_ids") or [tokenizer.eos_token_id]),
            admin_key=admin_key,
            system_prompt=rendering.system_prompt,
            max_model_len=info.get("max_model_len"),
            telemetry=self.telemetry,
            history=rendering.history,
            chat_format=rendering.chat_format,
            record_routed_experts=rendering.record_routed_experts,
        )
        self.runner, port = await start_server(gateway.app(), bind, 0, cancel_on_disconnect=False)
        return f"http://{reachable_host(bind)}:{port}"

    def set_engines(self, urls: list[str]) -> list[str]:
        """Route to `urls` from now on; the engines routed to."""
        self.pool.attach(urls)
        return [m.name for m in self.pool.members]

    def where(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def stop(self) -> None:
        for close in (
            self.runner and self.runner.cleanup,
            self.pool and self.pool.close,
            self.store and self.store.close,
            self.telemetry and self.telemetry.close,
        ):
            if close:
                await close()


class RayGateways:
    """The run's gateway actors, from the driver (see the module docstring)."""

    def __init__(self, role: GatewaysConfig, on_driver_node: bool, ready_timeout_s: float):
        self.role = role
        self.on_driver_node = on_driver_node
        self.ready_timeout_s = ready_timeout_s
        self.actors: list[Any] = []
        self.urls: list[str] = []
        self.placement: list[dict[str, Any]] = []
        self._engines: list[str] = []

    async def start(
        self,
        engine: EngineConfig,
        pool: PoolConfig,
        engine_urls: list[str],
        store: str,
        admin_key: str,
        rendering: Rendering,
        bind: str,
        telemetry: TelemetryConfig | None = None,
    ) -> list[str]:
        """Place `role.count` gateways and return their URLs; `ConfigError` naming the role if
        they cannot be placed in `cluster.ready_timeout_s`."""
        ray = import_ray()
        r = self.role
        options: dict[str, Any] = {
            "num_cpus": r.num_cpus,
            "num_gpus": r.num_gpus,
            "resources": dict(r.resources),
            "max_restarts": 0,
        }
        if self.on_driver_node:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        remote = ray.remote(GatewayServer).options(**options)
        self.actors = [remote.remote() for _ in range(r.count)]
        self._engines = list(engine_urls)
        args = (engine, pool, self._engines, store, admin_key, rendering, bind, telemetry)
        starts = [actor.start.remote(*args) for actor in self.actors]
        where = "on the driver's node (the SQLite store's)" if self.on_driver_node else ""
        self.urls = await started(starts, "gateways", "gateway", r, self.ready_timeout_s, where)
        self.placement = [
            {**await actor.where.remote(), "url": url, "engines": list(self._engines)}
            for actor, url in zip(self.actors, self.urls, strict=True)
        ]
        log.info("%d gateway actor(s) at %s", len(self.urls), self.urls)
        return self.urls

    async def follow(self, engine_urls: Any, interval_s: float) -> None:
        """Hand every gateway the driver pool's engine URLs whenever they change (an engine
        replaced); `engine_urls()` gives them. Runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            urls = list(engine_urls())
            if urls != self._engines:
                self._engines = urls
                routed = await asyncio.gather(*(a.set_engines.remote(urls) for a in self.actors))
                for record, engines in zip(self.placement, routed, strict=True):
                    record["engines"] = engines  # as each gateway reports it
                log.info("gateways now route to %s", urls)

    async def close(self) -> None:
        ray = import_ray()
        actors, self.actors = self.actors, []
        stops = [actor.stop.remote() for actor in actors]
        ray.wait(stops, num_returns=len(stops), timeout=30.0)
        for actor in actors:
            ray.kill(actor, no_restart=True)
