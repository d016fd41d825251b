"""LoRA adapters on vLLM and SGLang servers: one served name per pushed version.

Neither server replaces an adapter's weights under a name it already serves in a way a
training run can use: vLLM refuses the name unless `load_inplace` is set, and an in-place
adapter is read from its directory again on every forward step (vLLM 0.32's LoRA worker
reloads any request whose adapter says `load_inplace`); SGLang refuses the name. So each push
loads the adapter's directory for that version (`RUN_DIR/adapters/<step>/`, never rewritten)
under a name of its own, `<name>-v<version>`, and requests that name the adapter (`lora_path`)
are sent to its newest version. A request still running on the previous version finishes on
it, and its tokens are labelled with that version, which is exactly what sampled them: the
server's own version label is global, so this client's label is the one kept. Versions older
than the last `KEEP` are unloaded (their directories outlive them by one push, so a request
still running on one can be reloaded by the server).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tracerl.engine.client import EngineHTTPError

log = logging.getLogger(__name__)

KEEP = 2
"""Versions of an adapter a server holds: the newest and the one before it, which requests
that started before the push still run on."""


@dataclass
class ServedAdapters:
    """What one client has loaded on its server: each adapter's versions, oldest first."""

    versions: dict[str, list[int]] = field(default_factory=dict)

    @staticmethod
    def served_name(name: str, version: int) -> str:
        return f"{name}-v{version}"

    def newest(self, name: str) -> tuple[str, int] | None:
        """The served name and version requests naming `name` go to; None: not loaded here."""
        held = self.versions.get(name)
        return (self.served_name(name, held[-1]), held[-1]) if held else None

    def loaded(self, name: str, version: int) -> list[str]:
        """Record `version` of `name` as loaded; the served names to unload now."""
        held = [v for v in self.versions.get(name, []) if v != version] + [version]
        self.versions[name] = held[-KEEP:]
        return [self.served_name(name, v) for v in held[:-KEEP]]

    def names(self) -> set[str]:
        return set(self.versions)


async def settle(
    request: Callable[[str, str, Any], Awaitable[Any]],
    served: ServedAdapters,
    name: str,
    version: int,
    unload_path: str,
) -> None:
    """After version `version` of `name` loaded: unload the versions `served` no longer keeps
    (`unload_path`, the server's route) and set the server's weight version (`request`: the
    client's `(method, path, body)` call)."""
    for old in served.loaded(name, version):
        try:
            await request("POST", unload_path, {"lora_name": old})
        except EngineHTTPError as e:  # it stays loaded until the server evicts it: no harm
            log.warning("the server kept adapter %s: %s", old, e)
    await request("POST", "/update_weight_version", {"new_version": str(version)})
