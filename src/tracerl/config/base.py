"""The configuration base class, TOML loading, dotted overrides and error reporting.

Every config model derives from `Config` (`extra="forbid"`, attribute docstrings as field help).
`load_config` merges a TOML file with `a.b=value` overrides and validates once, so a wrong key, type
or value fails before any work starts with an error naming the dotted path and what was expected.
"""

from __future__ import annotations

import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

C = TypeVar("C", bound="Config")


class Config(BaseModel):
    """Base for every tracerl config model."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True, frozen=False
    )


class InputError(ValueError):
    """What a user gave (a config, a dataset) cannot be used; the message names what and where.
    The command line prints it without a traceback."""


class ConfigError(InputError):
    """A configuration that cannot be used; the message names every offending dotted path."""


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn `["a.b=1", "--c=x"]` into a nested dict; values are TOML literals, else strings."""
    nested: dict[str, Any] = {}
    for raw in overrides:
        item = raw[2:] if raw.startswith("--") else raw
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {raw!r}: expected KEY.PATH=VALUE")
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {raw!r}: {part!r} is set to a value and a table")
            node = child
        node[parts[-1]] = _parse_value(text)
    return nested


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _models(ann: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: one, or the members of a union of them."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    if typing.get_origin(ann) is typing.Annotated:
        return _models(typing.get_args(ann)[0])
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(ann) for m in _models(a)]
    return []


def _user_path(root: Any, loc: tuple[Any, ...]) -> str:
    """`loc` as the caller writes it: the tag pydantic inserts where a value holds one of
    several models (`env.arithmetic.sampling` for `env.sampling`) is left out. `root`: the
    annotation validated (a model class, or a union of them)."""
    parts: list[str] = []
    members, i = _models(root), 0
    while True:
        model = members[0] if len(members) == 1 else None
        if len(members) > 1 and i < len(loc):
            tags = {
                str(m.model_fields["name"].default): m for m in members if "name" in m.model_fields
            }
            if str(loc[i]) in tags:  # the variant's tag, not a key the caller wrote
                model = tags[str(loc[i])]
                i += 1
        if i >= len(loc):
            return ".".join(parts)
        part = loc[i]
        parts.append(str(part))
        i += 1
        field = (
            model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        )
        members = _models(field.annotation) if field is not None else []


def format_validation_error(err: ValidationError, source: str, root: Any = None) -> str:
    """One line per error, each `dotted.path: what was wrong`, in the caller's terms (`root`:
    the annotation validated, to leave pydantic's variant tags out of the paths)."""
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        path = _user_path(root, tuple(e["loc"]))
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):  # the key that chooses
            ctx = e.get("ctx", {})
            key = str(ctx.get("discriminator", "")).strip("'")
            tag = ctx.get("tag")
            what = (
                f"expected one of {ctx['expected_tags']} (got {json.dumps(tag, default=str)[:80]})"
                if tag is not None and "expected_tags" in ctx
                else "Field required (it chooses the variant)"
            )
            lines.append(f"  {path + '.' if path else ''}{key}: {what}")
            continue
        path = path or "<root>"
        got = e.get("input")
        shown = "" if e["type"] == "missing" else f" (got {json.dumps(got, default=str)[:80]})"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {path}: unknown key")
        else:
            lines.append(f"  {path}: {e['msg']}{shown}")
    return "\n".join(lines)


def load_config(
    cls: type[C],
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> C:
    """Validate `base` <- TOML file <- overrides into `cls`; `ConfigError` names each path."""
    data: dict[str, Any] = dict(base or {})
    sources = []
    if path is not None:
        p = Path(path)
        try:
            data = _merge(data, tomllib.loads(p.read_text()))
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
        sources.append(str(p))
    if overrides:
        data = _merge(data, parse_overrides(overrides))
        sources.append("command-line overrides")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        source = " + ".join(sources) or "defaults"
        raise ConfigError(format_validation_error(e, source, cls)) from None


def save_resolved_config(config: BaseModel, run_dir: str | Path) -> Path:
    """Write the fully resolved config (every default filled in) to `run_dir/config.json`."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    target = path / "config.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(config.model_dump_json(indent=2) + "\n")
    tmp.replace(target)
    return target


def field_help(cls: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted path, type, default, description) for every leaf field, for `--help` listings."""
    rows: list[tuple[str, str, str, str]] = []
    for name, field in cls.model_fields.items():
        path = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(field_help(ann, prefix=f"{path}."))
            continue
        default = "" if field.is_required() else repr(field.get_default(call_default_factory=True))
        rows.append((path, _type_name(ann), default, (field.description or "").strip()))
    return rows


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return "|".join(repr(a) for a in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(ann))
    if ann is type(None):
        return "None"
    return getattr(ann, "__name__", str(ann))
