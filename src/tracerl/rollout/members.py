"""The engine pool's members and how one of them takes a weight push. Split from `pool.py`,
whose `update_weights` pauses the members, calls `load_member` on each and takes out the ones
that fail."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from tracerl.engine.client import EngineHTTPError, EngineReplyError
from tracerl.engine.protocol import Engine
from tracerl.engine.types import EngineError, WeightLoadError
from tracerl.rollout.launcher import EngineLauncher

if TYPE_CHECKING:
    from tracerl.engine.adapters import AdapterFiles, AdapterWeights

RETRYABLE = (aiohttp.ClientError, TimeoutError, EngineReplyError, ConnectionError, EngineError)
"""What an engine raises when it, or the connection to it, failed (not the request)."""


@dataclass
class Member:
    name: str
    engine: Engine
    launcher: EngineLauncher | None = None
    active: bool = True
    failures: int = 0
    inflight: int = 0
    restarting: bool = False
    restart_deadline: float = 0.0
    weight_version: int = 0
    last_ok: float = field(default_factory=time.monotonic)


def takes_in_process(
    engine: Any, tensors: Sequence[tuple[str, Any]] | None, adapter: AdapterWeights | None
) -> bool:
    """`engine` can take this push without a model directory (an embedded engine)."""
    if adapter is not None and hasattr(engine, "update_adapter"):
        return True
    return tensors is not None and hasattr(engine, "update_weights")


def serves_adapters(engine: Any) -> bool:
    """`engine` is a server that loads LoRA adapters from disk by name."""
    return bool(getattr(engine, "serves_lora_adapters", False))


async def load_member(
    member: Member,
    model_path: str | None,
    version: int,
    tensors: Sequence[tuple[str, Any]] | None,
    adapter: AdapterWeights | None = None,
    adapter_files: AdapterFiles | None = None,
) -> Exception | None:
    """Load the weights into one engine: `adapter` or `tensors` in process where it takes
    them, `adapter_files` into a server that loads adapters, else `model_path`; the error, or
    None once it reports `version`."""
    in_process = getattr(member.engine, "update_weights", None)
    takes_adapter = getattr(member.engine, "update_adapter", None)
    try:
        if adapter is not None and takes_adapter is not None:
            await takes_adapter(adapter, version)
        elif adapter_files is not None and serves_adapters(member.engine):
            await load_adapter_files(member, adapter_files, version)
        elif tensors is not None and in_process is not None:
            await in_process(tensors, version)
        else:
            assert model_path is not None
            await from_disk(member, model_path, version)
        info = await member.engine.model_info()
    except (WeightLoadError, EngineHTTPError, *RETRYABLE) as e:
        return e
    reported = info.get("weight_version", -1)
    named = adapter.name if adapter is not None else getattr(adapter_files, "name", None)
    per_adapter = info.get("adapters")
    if isinstance(per_adapter, dict) and named in per_adapter:  # the adapter's own version
        reported = per_adapter[named]
    if int(reported) != version:
        return RuntimeError(f"reports v{reported}")
    member.weight_version = version
    return None


async def load_adapter_files(member: Member, files: AdapterFiles, version: int) -> None:
    """Load LoRA adapter `files` into one engine server: through its launcher when that
    delivers them itself (a Ray actor, which may first fetch them from the object store),
    else with the server's own `load_lora_adapter`."""
    deliver = getattr(member.launcher, "load_adapter", None)
    if deliver is not None:
        await deliver(files.name, files.path, version)
    else:
        await member.engine.load_lora_adapter(  # type: ignore[attr-defined]
            files.name, files.path, version
        )


async def from_disk(member: Member, model_path: str, version: int) -> None:
    """Load `model_path` into one engine: through its launcher when that delivers weights
    itself (a Ray actor, which may first fetch them from the object store), else with the
    engine's own `update_weights_from_disk`."""
    deliver = getattr(member.launcher, "load_weights", None)
    if deliver is not None:
        await deliver(model_path, version)
    else:
        await member.engine.update_weights_from_disk(model_path, version)
