"""The run's gateways and where its episodes play. Split from the loop; its start-up
(`startup.py`) calls `start` and `players`.

- One gateway in this process (the default) on 127.0.0.1, or on `cluster.bind` on Ray (agent
  workers on other nodes must reach it; it always requires its admin key and session keys).
- On Ray with `cluster.gateways.count`, gateways as actors (`tracerl.cluster.gateway_actor`)
  in front of the driver pool's engines, following it as it replaces them.
- Either way one store: the driver opens it too, to read each episode's trace back once.
- With `cluster.agents.workers`, episodes play on agent-worker actors
  (`tracerl.cluster.agent_workers`); else in this process.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracerl.cluster.ray_cluster import reachable_host
from tracerl.config import TrainCommandConfig

if TYPE_CHECKING:
    from tracerl.gateway.server import Gateway
    from tracerl.gateway.store import TraceStore
    from tracerl.rollout.pool import EnginePool
    from tracerl.run.rollouts import Player
    from tracerl.telemetry import Telemetry


@dataclass
class Gateways:
    store: TraceStore
    urls: list[str]
    admin_key: str
    local: Gateway | None = None
    """The gateway in this process (None when they are actors)."""
    actors: Any = None
    """`RayGateways`, when the gateways are actors."""
    records: list[dict[str, Any]] = field(default_factory=list)


async def start(
    config: TrainCommandConfig,
    pool: EnginePool,
    tokenizer: Any,
    run_dir: Path,
    closers: list[Any],
    telemetry: Telemetry | None = None,
) -> Gateways:
    """The run's store and gateways, serving; what must be closed goes on `closers`;
    `telemetry`: where a gateway in this process sends its request spans (actors build their
    own from `config.telemetry`)."""
    from tracerl.gateway.store import open_store

    where = config.trace_store or str(run_dir / "traces.sqlite")
    store = await open_store(where)
    closers.append(store.close)
    cluster = config.cluster
    if cluster.backend == "ray" and cluster.gateways.count:
        return await _actors(config, pool, store, where, closers)
    from tracerl.engine.server import start_server
    from tracerl.gateway.server import Gateway

    info = await pool.model_info()
    gateway = Gateway(
        pool,
        tokenizer,
        store,
        model_name=config.trainer.model,
        eos_ids=set(info.get("eos_token_ids") or [tokenizer.eos_token_id]),
        system_prompt=config.system_prompt,
        max_model_len=info.get("max_model_len"),
        telemetry=telemetry,
        history=config.history,
        chat_format=config.trainer.chat_format,
        record_routed_experts=config.trainer.moe.routing == "replay",
    )
    bind = cluster.bind if cluster.backend == "ray" else "127.0.0.1"
    runner, port = await start_server(gateway.app(), bind, 0, cancel_on_disconnect=False)
    closers.append(runner.cleanup)
    url = f"http://{reachable_host(bind)}:{port}"
    return Gateways(store, [url], gateway.admin_key, local=gateway)


async def _actors(
    config: TrainCommandConfig, pool: EnginePool, store: TraceStore, where: str, closers: list[Any]
) -> Gateways:
    from tracerl.chat_templates import read_template
    from tracerl.cluster.gateway_actor import RayGateways, Rendering

    cluster = config.cluster
    sqlite = not where.startswith(("postgresql://", "postgres://"))
    actors = RayGateways(cluster.gateways, sqlite, cluster.ready_timeout_s)
    closers.append(actors.close)
    admin_key = secrets.token_urlsafe(24)
    engine = config.engine.model_copy(update={"model": config.trainer.model})
    chat_template = config.trainer.chat_template  # read here: a file is the driver's
    template = read_template(chat_template) if chat_template is not None else None
    urls = await actors.start(
        engine,
        config.pool,
        engine_urls(pool),
        where,
        admin_key,
        Rendering(
            config.system_prompt,
            config.history,
            template,
            config.trainer.chat_format,
            config.trainer.moe.routing == "replay",
        ),
        cluster.bind,
        config.telemetry,
    )
    follow = asyncio.create_task(
        actors.follow(lambda: engine_urls(pool), config.pool.health_interval_s)
    )

    async def stop_following() -> None:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)

    closers.append(stop_following)
    return Gateways(store, urls, admin_key, actors=actors, records=actors.placement)


def engine_urls(pool: EnginePool) -> list[str]:
    """The URLs of the pool's engines (the servers; a restarted one's new URL)."""
    return [str(m.engine.base_url) for m in pool.members if hasattr(m.engine, "base_url")]


async def players(config: TrainCommandConfig, closers: list[Any]) -> tuple[Player | None, Any]:
    """Where episodes play: agent workers on Ray (`cluster.agents.workers`), and their
    handle for the run's records; or (None, None): in this process."""
    cluster = config.cluster
    if cluster.backend != "ray" or not cluster.agents.workers:
        return None, None
    from tracerl.cluster.agent_workers import AgentWorkers

    workers = AgentWorkers(config.env, cluster.agents, cluster.ready_timeout_s)
    closers.append(workers.close)
    await workers.start()
    return workers.play, workers
