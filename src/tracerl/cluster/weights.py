"""Each step's weights through Ray's object store (`cluster.weight_sync = "object_store"`), so
engines on other machines need no filesystem shared with the trainer.

The first time, rank 0 exports the actor as a Hugging Face directory on its own node (the ranks
gather the shards for it, as for any export) and reads the files engines load (weights, config,
tokenizer) into a `Package` (`Packer`). Later packages keep those files and carry the weights
as the actor's gathered tensors, viewed as raw bytes (numpy arrays, which Ray's object store
holds and hands out without copying), under the names the export gave them (when it held one
safetensors file of named parameters; otherwise every package is a full export). Rank 0 puts
the package in the object store; each engine actor writes the tensors straight from the store
into a safetensors file (`write_safetensors`): one copy into the store, one onto the node.

A LoRA run's package is its adapter alone (`pack_adapter`: peft's `adapter_config.json` and
`adapter_model.safetensors`, a few MB), published as `object-store:adapter-vN`; each engine
actor writes it to its node and has its server load it by name (`load_lora_adapter`).

The driver keeps the newest package's reference in a `WeightsChannel` under a name of its own
(`object-store:vN`), which is what the engine pool records as the weights' path: every engine
actor, and one that replaces a dead engine later, resolves that name to the package, writes it
to its own node's disk and has its server load it from there (`update_weights_from_disk`), so
every backend that loads from disk takes weights this way. The version rule is the pool's,
unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "object-store:"
SKIPPED = ("critic/",)
"""Export files engines never load."""


def pack(directory: Path) -> dict[str, bytes]:
    """The files of an exported model directory engines load, by relative path."""
    files = {}
    for path in sorted(directory.rglob("*")):
        name = path.relative_to(directory).as_posix()
        if path.is_file() and not name.startswith(SKIPPED):
            files[name] = path.read_bytes()
    if not any(name.endswith(".safetensors") for name in files):
        raise ValueError(f"{directory} holds no .safetensors weights to send")
    return files


Tensor = tuple[str, list[int], Any]
"""A tensor as the package carries it: safetensors dtype (`F32`, `BF16`, ...), shape, and its
bytes as a flat uint8 numpy array."""


@dataclass
class Package:
    """Model files by relative path, and the tensors of `model.safetensors` when that file
    is sent as tensors instead of bytes."""

    files: dict[str, bytes]
    tensors: dict[str, Tensor] = field(default_factory=dict)


def unpack(package: Package, directory: Path) -> Path:
    """Write a package as `directory` (replacing it whole: a server never reads a mix of two
    versions)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{directory.name}-", dir=directory.parent))
    try:
        for name, data in package.files.items():
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ValueError(f"weights package entry {name!r} leaves its directory")
            out = tmp / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        if package.tensors:
            write_safetensors(tmp / WEIGHTS, package.tensors)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return directory


WEIGHTS = "model.safetensors"
DTYPES = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}  # fmt: skip
"""torch dtype name -> safetensors dtype."""


def as_tensor(t: Any) -> Tensor:
    """A torch tensor as a package carries it (a view of its bytes: `ray.put` copies it)."""
    t = t.detach().cpu().contiguous()
    dtype = DTYPES[str(t.dtype).removeprefix("torch.")]
    import torch

    return dtype, list(t.shape), t.reshape(-1).view(torch.uint8).numpy()


def write_safetensors(path: Path, tensors: dict[str, Tensor]) -> None:
    """The safetensors file of `tensors`: an 8-byte header length, the JSON header (names,
    dtypes, shapes, byte ranges; padded to 8 bytes), then the tensors' bytes back to back."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + data.nbytes],
        }
        offset += data.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, _, data in tensors.values():
            f.write(memoryview(data))


class Packer:
    """A trainer rank's packages (see the module docstring). Every rank calls `package`
    (the gathers are collectives); rank 0 gets the package, the others None."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.names: list[str] | None = None
        """The weights' names in the export; None until one was made (or when every package
        must be a full export)."""

    def package(self, trainer: Any, rank: int) -> Package | None:
        if self.names is None:
            return self._export(trainer, rank)
        tensors = dict(trainer.actor_named_tensors())
        if rank != 0:
            return None
        return Package(dict(self.files), {name: as_tensor(tensors[name]) for name in self.names})

    def _export(self, trainer: Any, rank: int) -> Package | None:
        import torch

        from tracerl.algo.distributed import all_reduce_max
        from tracerl.train.checkpoint import TIED_HEAD_FILE

        scratch = scratch_dir()
        try:
            exported = Path(trainer.export(scratch / "actor"))
            files = pack(exported) if rank == 0 else {}
            names = _parameter_names(exported, trainer) if rank == 0 else None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        # rank 0 alone read the export; every rank must agree on the next package's kind
        reusable = all_reduce_max(torch.tensor(float(names is not None)))
        if reusable.item():  # the weights' files: written from the tensors from now on
            self.files = {k: v for k, v in files.items() if k not in (WEIGHTS, TIED_HEAD_FILE)}
            self.names = names or []
        return Package(files) if rank == 0 else None


def _parameter_names(exported: Path, trainer: Any) -> list[str] | None:
    """The names in the export's one safetensors file (and its tied output layer's, which a
    later package then carries in that file) when each is a parameter of the actor (so a
    later package can be serialized from the parameters), else None."""
    from safetensors import safe_open

    from tracerl.train.checkpoint import TIED_HEAD_FILE

    files = sorted(p.name for p in exported.glob("*.safetensors"))
    if files not in ([WEIGHTS], sorted([WEIGHTS, TIED_HEAD_FILE])):
        return None  # sharded into several files
    names = []
    for name in files:
        with safe_open(str(exported / name), framework="pt") as f:
            names += list(f.keys())
    parameters = {n for n, _ in trainer.actor.named_parameters(remove_duplicate=False)}
    return names if set(names) <= parameters else None


def scratch_dir() -> Path:
    """Where a node writes weights it is sent: memory-backed /dev/shm when there is one."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix="tracerl-weights-", dir=base))


def pack_adapter(trainer: Any) -> Package:
    """The trainer's LoRA adapter as a package (peft's two files, read from a scratch
    directory it is written to and removed from)."""
    scratch = scratch_dir()
    try:
        return Package(pack(Path(trainer.write_adapter(scratch / "adapter"))))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class WeightsChannel:
    """The driver's newest weights package: its name (the pool's weights path) and its object
    reference, which keeps it in the object store until a newer one replaces it."""

    name: str | None = None
    ref: Any = None

    def publish(self, version: int, ref: Any, adapter: bool = False) -> str:
        self.name, self.ref = f"{PREFIX}{'adapter-' if adapter else ''}v{version}", ref
        return self.name

    def resolve(self, path: str) -> Any:
        """The package reference for `path` when it names the newest package; else `path`
        itself (a directory the server loads as it is)."""
        if path.startswith(PREFIX):
            if path != self.name:
                raise ValueError(f"weights {path} are gone (the newest are {self.name})")
            return self.ref
        return path
