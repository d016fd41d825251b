"""The run's engines: which kind they are, starting them behind the pool, and giving them each
step's weights. Split from the loop: `startup.py` starts them, `loop.py` pushes every step's.

- Embedded (`engine.backend = "local"`, no `engine.urls`) or given in-process engines start in
  this process and take the trainer's tensors in process.
- Servers (any other backend, or `engine.urls`) are launched or attached by
  `tracerl.rollout.backends`; they load the actor the trainer exports to `RUN_DIR/weights/`.
- On Ray (`cluster.backend = "ray"`) every engine is a server (the embedded engine as
  `tracerl engine`), launched by an actor of its own (`tracerl.cluster.engine_actor`), and
  takes weights through the object store (`cluster.weight_sync`, `tracerl.cluster.weights`).
- A LoRA run gives servers that load adapters its adapter alone (`adapter_sync`): from
  `RUN_DIR/adapters/<step>/`, or on Ray through the object store.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracerl.config import TrainCommandConfig

if TYPE_CHECKING:
    from tracerl.cluster.weights import WeightsChannel
    from tracerl.rollout.pool import EnginePool
    from tracerl.run.trainers import AnyTrainer
    from tracerl.telemetry import Telemetry


def served(config: TrainCommandConfig, given: dict[str, Any] | None) -> bool:
    """The engines are servers the pool launches or attaches to (vLLM, SGLang, ...)."""
    engine = config.engine
    on_ray = config.cluster.backend == "ray"
    return given is None and (engine.backend != "local" or bool(engine.urls) or on_ray)


def shares_cpu(
    config: TrainCommandConfig, given: dict[str, Any] | None, trainer: AnyTrainer
) -> bool:
    """The trainer and the engines compute on the same cores: engines this run starts
    (embedded, or servers launched here) with a CPU trainer. Given engines (the benchmarks'
    simulated ones) do no compute, and attached ones run elsewhere."""
    attached = served(config, given) and bool(config.engine.urls)
    return given is None and not attached and trainer.device.type == "cpu"


def _object_store(trainer: AnyTrainer) -> WeightsChannel | None:
    """The trainer's object-store weights channel: trainer ranks on Ray with
    `cluster.weight_sync = "object_store"`."""
    from tracerl.cluster.trainer_group import RayTrainer

    return trainer.weights if isinstance(trainer, RayTrainer) else None


async def export(trainer: AnyTrainer, run_dir: Path) -> Path:
    """The actor as a Hugging Face directory in the run directory (replaced atomically), for
    engines in other processes to load."""
    return await asyncio.to_thread(trainer.export, run_dir / "weights")


async def start(
    config: TrainCommandConfig,
    given: dict[str, Any] | None,
    trainer: AnyTrainer,
    run_dir: Path,
    step: int,
    closers: list[Any],
    telemetry: Telemetry | None = None,
) -> EnginePool:
    """The started pool over the run's engines, on the weights of `step` (0: the base model);
    what must be closed at the end is appended to `closers`; `telemetry`: where its generation
    spans go."""
    from tracerl.rollout.pool import EnginePool, Member

    if served(config, given):
        from tracerl.models import resolve_model
        from tracerl.rollout.backends import backend_log_dir, start_pool

        # a resumed run's engines start on its trained weights (sent once they run, through
        # the object store), a new run's on the base
        channel = _object_store(trainer)
        # adapters pushed to servers go on the base: never start them on a merged export
        from_disk = bool(step) and channel is None and not adapter_sync(config)
        base = await export(trainer, run_dir) if from_disk else resolve_model(config.trainer.model)
        logs = backend_log_dir(config.engine, run_dir / "logs")
        launcher_for = None
        if config.cluster.backend == "ray":
            from tracerl.cluster.engine_actor import RayEngineLauncher

            def launcher_for(i: int, _: Any) -> RayEngineLauncher:
                log_path, cluster = logs / f"engine-{i}.log", config.cluster
                return RayEngineLauncher(
                    config.engine, cluster.engines, base, log_path, i, cluster.bind, channel
                )

        pool = await start_pool(config.engine, base, logs, config.pool, launcher_for, telemetry)
        closers.append(pool.close)
        if step and not from_disk:
            await push(pool, trainer, run_dir, step, servers=True, adapters=adapter_sync(config))
        return pool
    from tracerl.engine.local import LocalEngine

    engines = given or {"local": LocalEngine(config.engine)}
    for engine in engines.values():
        await engine.start()
        closers.append(engine.close)
    pool = EnginePool([Member(n, e) for n, e in engines.items()], config.pool, telemetry=telemetry)
    await pool.start()
    closers.append(pool.close)
    if step:  # engines start from the base weights: give them the trained ones
        await push(pool, trainer, run_dir, step, servers=False)
    return pool


def adapter_sync(config: TrainCommandConfig) -> bool:
    """Engine servers take a LoRA run's adapters alone (loaded by name over their base):
    tracerl's own engine servers, and vLLM or SGLang ones with LoRA enabled
    (`engine.lora_rank`, which a LoRA run sets for servers it launches), on Ray too."""
    engine = config.engine
    takes = engine.backend == "local" or (engine.backend != "sim" and engine.lora_rank > 0)
    return takes and config.trainer.lora is not None


async def push(
    pool: EnginePool,
    trainer: AnyTrainer,
    run_dir: Path,
    step: int,
    servers: bool,
    adapters: bool = False,
) -> int:
    """Step `step`'s weights into every engine: in process (with LoRA the adapters alone);
    for servers, the adapters alone when `adapters` (`adapter_sync`), else the weights; both
    through the object store (trainer ranks on Ray, by default) or from files in the run
    directory (without adapter sync, a LoRA run's export is merged). Returns the bytes handed
    over: the tensors given in process, or the files (or package) written for the servers."""
    if not servers:
        adapter = trainer.adapter_weights()
        if adapter is not None and all(hasattr(m.engine, "update_adapter") for m in pool.members):
            await pool.update_weights(None, step, adapter=adapter)
            return adapter.nbytes
        tensors = trainer.actor_named_tensors()
        await pool.update_weights(None, step, tensors)
        return _nbytes(tensors)
    from tracerl.cluster.trainer_group import RayTrainer

    if adapters:
        from tracerl.engine.adapters import AdapterFiles

        if isinstance(trainer, RayTrainer) and trainer.weights is not None:
            name, nbytes = await asyncio.to_thread(trainer.publish_adapter, step)
            await pool.update_weights(None, step, adapter_files=AdapterFiles(run_dir.name, name))
            return nbytes
        written = await asyncio.to_thread(trainer.write_adapter, run_dir / ADAPTERS / str(step))
        files = AdapterFiles(run_dir.name, str(written))
        await pool.update_weights(None, step, adapter_files=files)
        _prune_adapters(run_dir / ADAPTERS, step)
        return sum(f.stat().st_size for f in written.iterdir())
    if isinstance(trainer, RayTrainer) and trainer.weights is not None:
        path = await asyncio.to_thread(trainer.publish_weights, step)
        await pool.update_weights(path, step)
        return 0  # the object store's transfers are Ray's
    exported = await export(trainer, run_dir)
    await pool.update_weights(str(exported), step)
    return sum(f.stat().st_size for f in exported.glob("*.safetensors"))


ADAPTERS = "adapters"
"""`RUN_DIR/adapters/<step>/`: each pushed adapter version, in peft's layout; a server may
read one again while requests still run on it (`tracerl.engine.served_adapters`)."""
KEPT_ADAPTER_DIRS = 3


def _prune_adapters(root: Path, newest: int) -> None:
    """Remove the pushed adapter directories older than the newest `KEPT_ADAPTER_DIRS`
    (one more than a server holds, so one it just unloaded can still be read)."""
    import shutil

    steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())
    for old in [s for s in steps if s <= newest][:-KEPT_ADAPTER_DIRS]:
        shutil.rmtree(root / str(old), ignore_errors=True)


def _nbytes(tensors: list[tuple[str, Any]]) -> int:
    """The bytes of distinct tensors (a tied output layer counted once)."""
    seen = {t.data_ptr(): t.numel() * t.element_size() for _, t in tensors}
    return sum(seen.values())
