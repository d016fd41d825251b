"""Checkpoints on disk: atomic, verified, pruned; and the Hugging Face export.

A checkpoint is a directory `step_00000042/` under the checkpoints directory (the run's
`checkpoints/`):

    manifest.json        format, step, ranks, the resolved trainer config, size and sha256 of
                         each file
    model/               `torch.distributed.checkpoint` (DCP): the trained models and their
                         optimizers' states, by parameter name (`actor`, `actor_optimizer`,
                         `critic`, `critic_optimizer`)
    state.pt             schedulers, RNG states
    loop_state.bin|json  the RL loop's opaque state (data position, controller state)

DCP writes each rank's shards of an FSDP2-sharded trainer and reads them into any other
sharding, so a checkpoint saved on 2 ranks resumes on 1 and the reverse (one process saves and
loads plain tensors the same way). Under a process group every rank calls in: rank 0 picks the
temporary directory and writes everything but the shards; the directory must be one every rank
sees (a shared filesystem across machines). Format 1 checkpoints (`actor.safetensors`, and the
optimizers in `state.pt`) still load in one process.

It is written into a hidden temporary directory, files fsynced, `manifest.json` last, then
renamed into place, so a reader sees a complete checkpoint or none. Reading verifies the
manifest, every file's size and hash, and the config before anything is loaded: a torn write or
a different config is a `CheckpointError`, never a partial load. This module knows nothing of
the trainer; `Trainer.save_checkpoint` / `load_checkpoint` assemble what goes in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_model, save_file, save_model
from torch.distributed.checkpoint.api import CheckpointException

from tracerl.train.shard import local_nbytes, world

FORMAT = 2
FORMATS = (1, 2)  # readable ones
MANIFEST = "manifest.json"
PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (torn, missing, corrupt, or from another config)."""


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def list_checkpoints(directory: str | Path, complete_when: str = MANIFEST) -> list[Path]:
    """Complete checkpoints (the file `complete_when` is present: a manifest) under
    `directory`, oldest first; the run's snapshots are listed the same way."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(PREFIX) and (p / complete_when).is_file()
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


@contextlib.contextmanager
def one_process_is_intended() -> Iterator[None]:
    """DCP warns that it assumes one process when no process group exists: that is the
    one-process trainer, and what it means."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _model_states(
    models: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer]
) -> dict[str, Any]:
    """What DCP saves and loads in place: each model's and optimizer's state by parameter name
    (sharded DTensors under FSDP2, plain tensors in one process). Frozen parameters (a LoRA
    model's base) are left out: they are the base model's, which the config names."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    out: dict[str, Any] = {}
    for name, module in models.items():
        options = state_options(module)
        out[name] = get_model_state_dict(module, options=options)
        if name in optimizers:
            out[f"{name}_optimizer"] = get_optimizer_state_dict(
                module, optimizers[name], options=options
            )
    return out


def state_options(module: torch.nn.Module) -> Any:
    """Trained parameters only; strict loading unless some are frozen (then the keys are the
    trained ones, which the saved state must hold: DCP refuses a missing one)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen = any(not p.requires_grad for p in module.parameters())
    return StateDictOptions(ignore_frozen_params=True, strict=not frozen)


def on_rank_zero(work: Any) -> Any:
    """Run `work()` on rank 0 and hand its result, or its error, to every rank, so a failure
    there raises everywhere instead of leaving the others waiting in a collective."""
    rank, world_size = world()
    result: list[Any] = [None, None]
    if rank == 0:
        try:
            result = [work(), None]
        except Exception as e:  # handed to every rank, then raised there
            result = [None, f"{type(e).__name__}: {e}"]
    if world_size > 1:
        dist.broadcast_object_list(result, src=0)
    if result[1] is not None:
        raise CheckpointError(f"rank 0 failed: {result[1]}")
    return result[0]


def write_checkpoint(
    directory: str | Path,
    step: int,
    config: dict[str, Any],
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict[str, Any],
    loop_state: bytes | dict[str, Any] | None,
    keep_last_n: int,
) -> Path:
    """Write checkpoint `step` atomically, then delete all but the newest `keep_last_n`.
    Under a process group every rank calls this with its shards."""
    import torch.distributed.checkpoint as dcp

    root = Path(directory)
    rank, world_size = world()

    def make_tmp() -> str:
        root.mkdir(parents=True, exist_ok=True)
        return tempfile.mkdtemp(prefix=f".tmp-{checkpoint_name(step)}-", dir=root)

    tmp = Path(on_rank_zero(make_tmp))
    states = _model_states(models, optimizers)
    try:
        with one_process_is_intended():
            try:
                dcp.save(states, checkpoint_id=str(tmp / "model"), no_dist=world_size == 1)
            except (Exception, CheckpointException) as e:
                raise write_failed(root, step, _nbytes(states), e) from e
        if world_size > 1:
            dist.barrier()
        target = on_rank_zero(
            lambda: _finish(root, tmp, step, config, state, loop_state, world_size)
        )
    finally:
        if rank == 0 and tmp.exists():
            shutil.rmtree(tmp)
    if rank == 0:
        for stale in list_checkpoints(root)[:-keep_last_n]:
            shutil.rmtree(stale)
    return Path(target)


def training_state(step: int, actor_scheduler: Any, critic_scheduler: Any | None) -> dict[str, Any]:
    """What a resume restores beside the weights and optimizers: the step, the learning-rate
    schedules and every random generator's state (`restore_training_state` puts them back)."""
    state: dict[str, Any] = {
        "step": step,
        "actor_scheduler": actor_scheduler.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
    }
    if critic_scheduler is not None:
        state["critic_scheduler"] = critic_scheduler.state_dict()
    return state


def restore_training_state(
    state: dict[str, Any], actor_scheduler: Any, critic_scheduler: Any | None
) -> None:
    """Put back what `training_state` saved: the schedules and the random generators."""
    actor_scheduler.load_state_dict(state["actor_scheduler"])
    if critic_scheduler is not None:
        critic_scheduler.load_state_dict(state["critic_scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])


def _nbytes(tree: Any) -> int:
    """Bytes of the tensors in a nested state dict (this rank's shards of a DTensor)."""
    if isinstance(tree, dict):
        return sum(_nbytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_nbytes(v) for v in tree)
    return local_nbytes(tree) if isinstance(tree, torch.Tensor) else 0


def dcp_failures(error: BaseException) -> str:
    """DCP's error as one line: each rank's exception, without torch's traceback. (DCP raises
    `CheckpointException`, a `BaseException`: it would pass every `except Exception` above;
    callers get a `CheckpointError` instead.)"""
    if isinstance(error, CheckpointException):
        return "; ".join(
            f"rank {rank}: {type(exc).__name__}: {exc}" for rank, (exc, _) in error.failures.items()
        )
    return f"{type(error).__name__}: {error}"


def write_failed(root: Path, step: int, needed: int, error: BaseException) -> CheckpointError:
    """The error of a failed write of checkpoint `step`, naming a full disk when it has less
    room than the checkpoint takes: torch reports that as `unexpected pos N vs M`, which says
    nothing of the disk."""
    cause = dcp_failures(error)
    free = shutil.disk_usage(root).free
    if free < needed:
        cause = (
            f"its disk has {free / 2**20:.0f} MiB free, less than the checkpoint's "
            f"{needed / 2**20:.0f} MiB (free space there, or set trainer.keep_last_n / "
            f"loop.checkpoint_every); {cause}"
        )
    return CheckpointError(
        f"writing checkpoint {checkpoint_name(step)} under {root} failed: {cause}"
    )


def _finish(
    root: Path,
    tmp: Path,
    step: int,
    config: dict[str, Any],
    state: dict[str, Any],
    loop_state: bytes | dict[str, Any] | None,
    world_size: int,
) -> str:
    """Rank 0's part: the files beside the shards, fsynced, the manifest last, the rename."""
    files = sorted(p for p in (tmp / "model").rglob("*") if p.is_file())
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
    _fsync(tmp / "model")
    manifest = {
        "format": FORMAT,
        "step": step,
        "ranks": world_size,
        "config": config,
        "loop_state": kind,
        "files": {
            str(f.relative_to(tmp)): {"bytes": f.stat().st_size, "sha256": _digest(f)}
            for f in files
        },
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
    return str(target)


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
    if manifest.get("format") not in FORMATS:
        raise CheckpointError(
            f"{root}: format {manifest.get('format')!r}, this tracerl reads {FORMATS}"
        )
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
    """`path: saved != current` for every differing leaf, except top-level `ignore` keys and
    settings the saved config predates that are unset now."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if not prefix and key in ignore:
            continue
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if key not in saved and b is None:  # a setting added since, left unset
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, ignore, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} in the checkpoint, {b!r} now")
    return out


def read_checkpoint(
    path: str | Path,
    config: dict[str, Any],
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    ignore: frozenset[str] = frozenset(),
) -> tuple[int, dict[str, Any], bytes | dict[str, Any] | None]:
    """Verify `path`, load `models` and `optimizers` in place (resharded to this process
    group), return `(step, state, loop_state)`."""
    root = Path(path)
    manifest = verify_checkpoint(root, config, ignore)
    state = torch.load(root / "state.pt", map_location="cpu", weights_only=True)
    kind = manifest["loop_state"]
    loop_state: bytes | dict[str, Any] | None = None
    if kind == "bytes":
        loop_state = (root / "loop_state.bin").read_bytes()
    elif kind == "json":
        loop_state = json.loads((root / "loop_state.json").read_text())
    if manifest["format"] == 1:
        _load_format_1(root, manifest, state, models, optimizers)
    else:
        _load_shards(root, models, optimizers)
    return int(manifest["step"]), state, loop_state


def _load_shards(
    root: Path, models: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer]
) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    states = _model_states(models, optimizers)
    try:
        saved = dcp.FileSystemReader(str(root / "model")).read_metadata().state_dict_metadata
        names = {key.split(".", 1)[0] for key in saved}
        if names != set(states):
            raise CheckpointError(f"{root}: holds {sorted(names)}, expected {sorted(states)}")
        with one_process_is_intended():
            dcp.load(states, checkpoint_id=str(root / "model"), no_dist=world()[1] == 1)
        for name, module in models.items():
            options = state_options(module)
            set_model_state_dict(module, states[name], options=options)
            if name in optimizers:
                set_optimizer_state_dict(
                    module, optimizers[name], states[f"{name}_optimizer"], options=options
                )
    except CheckpointError:
        raise
    except (RuntimeError, ValueError, KeyError, CheckpointException) as e:
        raise CheckpointError(
            f"{root}: the saved models do not fit these ({dcp_failures(e)}); the trainer is "
            "now partly loaded and must be rebuilt"
        ) from None


def _load_format_1(
    root: Path,
    manifest: dict[str, Any],
    state: dict[str, Any],
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
) -> None:
    if world()[1] > 1:
        raise CheckpointError(
            f"{root}: a format-1 checkpoint loads in one process only; resume it on one rank "
            "and save again to shard it"
        )
    expected = {f"{name}.safetensors" for name in models}
    present = {n for n in manifest["files"] if n.endswith(".safetensors")}
    if expected != present:
        raise CheckpointError(
            f"{root}: holds weights {sorted(present)}, expected {sorted(expected)}"
        )
    for name, module in models.items():
        try:
            load_model(module, str(root / f"{name}.safetensors"), strict=True)
        except RuntimeError as e:
            raise CheckpointError(
                f"{root}: {name} weights do not fit the model ({e}); the trainer is now "
                "partly loaded and must be rebuilt"
            ) from None
        if name in optimizers:
            optimizers[name].load_state_dict(state[f"{name}_optimizer"])


TIED_HEAD_FILE = "tied-output-layer.safetensors"


def _write_tied_head(directory: Path, actor: Any, state: dict[str, torch.Tensor] | None) -> None:
    """Write a tied output layer's weight under its own name, which `save_pretrained` leaves out
    (it is the input embedding). vLLM reloads weights layer by layer and puts back the previous
    tensors of a layer the checkpoint gave none: its tied output layer kept its initial weights
    after every update, reported as a success. With the weight named, it loads it (the same
    values into the storage both layers share); transformers, which reads only the files of
    its index (or `model.safetensors`), and the embedded engine ignore or accept the copy."""
    config = getattr(actor, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return
    names = {id(m): n for n, m in actor.named_modules()}
    name = names[id(actor.get_output_embeddings())] + ".weight"
    embedding = names[id(actor.get_input_embeddings())] + ".weight"
    if state is None:  # the module is whole
        weight = actor.get_output_embeddings().weight
    else:  # a sharded module: the full state dict has it under one name or the other
        weight = state[name] if name in state else state[embedding]
    save_file({name: weight.detach().contiguous().cpu()}, str(directory / TIED_HEAD_FILE))
    index = directory / "model.safetensors.index.json"
    if index.exists():  # a sharded export: the index names every file a loader reads
        listing = json.loads(index.read_text())
        listing["weight_map"][name] = TIED_HEAD_FILE
        index.write_text(json.dumps(listing, indent=2))


def export_hf(
    path: Path,
    actor: Any,
    tokenizer: Any,
    critic: torch.nn.Module | None = None,
    states: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """The actor as a Hugging Face directory (safetensors + config + tokenizer), the critic's
    weights and config under `critic/`. Written beside `path` and renamed over it, so an engine
    loading `path` never reads a half-written export. `states`: the models' full state dicts
    (`actor`, `critic`) when the modules themselves are sharded."""
    with replaced_atomically(path) as tmp:
        actor.save_pretrained(
            tmp, safe_serialization=True, state_dict=states["actor"] if states else None
        )
        _write_tied_head(tmp, actor, states["actor"] if states else None)
        tokenizer.save_pretrained(tmp)
        if critic is not None:
            (tmp / "critic").mkdir()
            out = tmp / "critic" / "model.safetensors"
            if states:
                save_file({k: v.contiguous() for k, v in states["critic"].items()}, str(out))
            else:
                save_model(critic, str(out))
            config: Any = critic.config
            config.save_pretrained(tmp / "critic")
    return path


@contextlib.contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """A fresh directory beside `path` to write into; on success it is renamed over `path` (a
    reader sees the old directory or the new one, never a half-written one), on failure
    removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        yield tmp
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
