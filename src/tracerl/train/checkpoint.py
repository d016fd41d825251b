"""Checkpoints on disk: atomic, verified, pruned; and the Hugging Face export.

A checkpoint is a directory `step_00000042/` under the checkpoints directory (the run's
`checkpoints/`):

    manifest.json        format, step, the resolved trainer config, size and sha256 of each file
    actor.safetensors    critic.safetensors (ppo)
    state.pt             optimizers, schedulers, RNG states
    loop_state.bin|json  the RL loop's opaque state (data position, controller state)

It is written into a hidden temporary directory, files fsynced, `manifest.json` last, then
renamed into place, so a reader sees a complete checkpoint or none. Reading verifies the
manifest, every file's size and hash, and the config before anything is loaded: a torn write or
a different config is a `CheckpointError`, never a partial load. This module knows nothing of
the trainer; `Trainer.save_checkpoint` / `load_checkpoint` assemble what goes in.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

FORMAT = 1
MANIFEST = "manifest.json"
PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (torn, missing, corrupt, or from another config)."""


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete checkpoints (a manifest is present) under `directory`, oldest first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(PREFIX) and (p / MANIFEST).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest complete checkpoint under `directory`, or None."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    directory: str | Path,
    step: int,
    config: dict[str, Any],
    models: dict[str, torch.nn.Module],
    state: dict[str, Any],
    loop_state: bytes | dict[str, Any] | None,
    keep_last_n: int,
) -> Path:
    """Write checkpoint `step` atomically, then delete all but the newest `keep_last_n`."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{checkpoint_name(step)}-", dir=root))
    try:
        files: list[Path] = []
        for name, module in models.items():
            files.append(tmp / f"{name}.safetensors")
            save_model(module, str(files[-1]))
        files.append(tmp / "state.pt")
        torch.save(state, files[-1])
        kind = None
        if isinstance(loop_state, bytes | bytearray):
            kind = "bytes"
            files.append(tmp / "loop_state.bin")
            files[-1].write_bytes(bytes(loop_state))
        elif loop_state is not None:
            kind = "json"
            files.append(tmp / "loop_state.json")
            files[-1].write_text(json.dumps(loop_state))
        for f in files:
            _fsync(f)
        manifest = {
            "format": FORMAT,
            "step": step,
            "config": config,
            "loop_state": kind,
            "files": {f.name: {"bytes": f.stat().st_size, "sha256": _digest(f)} for f in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        _fsync(tmp / MANIFEST)
        target = root / checkpoint_name(step)
        if target.exists():  # the same step saved again: replace it whole
            old = root / f".old-{target.name}-{os.getpid()}"
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old)
        else:
            tmp.rename(target)
        _fsync(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    for stale in list_checkpoints(root)[:-keep_last_n]:
        shutil.rmtree(stale)
    return target


def verify_checkpoint(
    path: str | Path, config: dict[str, Any], ignore: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Check `path` completely (manifest, files, config); return its manifest."""
    root = Path(path)
    if not (root / MANIFEST).is_file():
        raise CheckpointError(f"{root}: no {MANIFEST} (not a checkpoint, or a torn write)")
    try:
        manifest: dict[str, Any] = json.loads((root / MANIFEST).read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{root}/{MANIFEST}: not valid JSON ({e})") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{root}: format {manifest.get('format')!r}, expected {FORMAT}")
    for name, meta in manifest["files"].items():
        f = root / name
        if not f.is_file():
            raise CheckpointError(f"{root}: {name} is missing")
        if f.stat().st_size != meta["bytes"] or _digest(f) != meta["sha256"]:
            raise CheckpointError(f"{root}: {name} does not match its manifest (corrupt or torn)")
    diffs = config_differences(manifest["config"], config, ignore)
    if diffs:
        raise CheckpointError(
            f"{root} was written with a different config: " + "; ".join(diffs[:10])
        )
    return manifest


def config_differences(
    saved: dict[str, Any], current: dict[str, Any], ignore: frozenset[str], prefix: str = ""
) -> list[str]:
    """`path: saved != current` for every differing leaf, except top-level `ignore` keys."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if not prefix and key in ignore:
            continue
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, ignore, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} in the checkpoint, {b!r} now")
    return out


def read_checkpoint(
    path: str | Path,
    config: dict[str, Any],
    models: dict[str, torch.nn.Module],
    ignore: frozenset[str] = frozenset(),
) -> tuple[int, dict[str, Any], bytes | dict[str, Any] | None]:
    """Verify `path`, load `models` in place, return `(step, state, loop_state)`."""
    root = Path(path)
    manifest = verify_checkpoint(root, config, ignore)
    expected = {f"{name}.safetensors" for name in models}
    present = {n for n in manifest["files"] if n.endswith(".safetensors")}
    if expected != present:
        raise CheckpointError(
            f"{root}: holds weights {sorted(present)}, expected {sorted(expected)}"
        )
    state = torch.load(root / "state.pt", map_location="cpu", weights_only=True)
    kind = manifest["loop_state"]
    loop_state: bytes | dict[str, Any] | None = None
    if kind == "bytes":
        loop_state = (root / "loop_state.bin").read_bytes()
    elif kind == "json":
        loop_state = json.loads((root / "loop_state.json").read_text())
    for name, module in models.items():
        try:
            load_model(module, str(root / f"{name}.safetensors"), strict=True)
        except RuntimeError as e:
            raise CheckpointError(
                f"{root}: {name} weights do not fit the model ({e}); the trainer is now "
                "partly loaded and must be rebuilt"
            ) from None
    return int(manifest["step"]), state, loop_state


def export_hf(
    path: Path, actor: Any, tokenizer: Any, critic: torch.nn.Module | None = None
) -> Path:
    """The actor as a Hugging Face directory (safetensors + config + tokenizer), the critic's
    weights and config under `critic/`. Written beside `path` and renamed over it, so an engine
    loading `path` never reads a half-written export."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        actor.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if critic is not None:
            (tmp / "critic").mkdir()
            save_model(critic, str(tmp / "critic" / "model.safetensors"))
            config: Any = critic.config
            config.save_pretrained(tmp / "critic")
        if path.exists():
            old = path.parent / f".old-{path.name}-{os.getpid()}"
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return path
