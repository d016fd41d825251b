"""Every field of every command's config, given a wrong type and an out-of-range value: each is
refused by validation (before any process starts) with an error naming its dotted path."""

from __future__ import annotations

import json
import typing
from types import UnionType
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel

from tracerl.config import (
    ConfigError,
    EngineCommandConfig,
    GatewayCommandConfig,
    ServeConfig,
    TrainCommandConfig,
    load_config,
)
from tracerl.config.base import _models

COMMANDS = {
    "train": TrainCommandConfig,
    "engine": EngineCommandConfig,
    "gateway": GatewayCommandConfig,
    "serve": ServeConfig,
}


def leaves(cls: type[BaseModel], prefix: str = "", base: dict[str, Any] | None = None):
    """(dotted path, annotation, field info, overrides that select its variant) per leaf."""
    for name, field in cls.model_fields.items():
        path = f"{prefix}{name}"
        models = _models(field.annotation)
        if models:
            for model in models:
                tag = model.model_fields.get("name")
                select = dict(base or {})
                if len(models) > 1 and tag is not None:  # a variant of a tagged union
                    select[f"{path}.name"] = tag.default
                yield from leaves(model, f"{path}.", select)
            continue
        yield path, field.annotation, field, dict(base or {})


def _scalar(ann: Any) -> set[Any]:
    origin = typing.get_origin(ann)
    if origin in (typing.Union, UnionType):
        return {t for a in typing.get_args(ann) for t in _scalar(a)}
    if origin is typing.Literal:
        return {"literal"}
    return {origin or ann}


def wrong_type(ann: Any) -> Any:
    kinds = _scalar(ann)
    if kinds & {int, float, bool}:
        return "not a number"
    if "literal" in kinds or str in kinds:
        return [1, 2]
    if kinds & {list, tuple, dict}:
        return "not a collection"
    return [[1]]


def out_of_range(field: Any) -> Any | None:
    for meta in field.metadata:
        if isinstance(meta, annotated_types.Ge):
            return meta.ge - 1
        if isinstance(meta, annotated_types.Gt):
            return meta.gt - (1 if isinstance(meta.gt, int) else 1e-3)
        if isinstance(meta, annotated_types.Le):
            return meta.le + 1
        if isinstance(meta, annotated_types.Lt):
            return meta.lt + 1
    if typing.get_origin(field.annotation) is typing.Literal:
        return "no-such-choice"
    return None


CASES = [
    (command, path, ann, field, select)
    for command, cls in COMMANDS.items()
    for path, ann, field, select in leaves(cls)
]


def _refused(cls: type[BaseModel], path: str, value: Any, select: dict[str, Any]) -> str:
    overrides = [f"{k}={json.dumps(v)}" for k, v in select.items()]
    overrides.append(f"{path}={json.dumps(value)}")
    with pytest.raises(ConfigError) as err:
        load_config(cls, None, overrides)
    return str(err.value)


@pytest.mark.parametrize(("command", "path", "ann", "field", "select"), CASES,
                         ids=[f"{c[0]}:{c[1]}" for c in CASES])  # fmt: skip
def test_every_field_refuses_a_wrong_type_and_an_out_of_range_value(
    command: str, path: str, ann: Any, field: Any, select: dict[str, Any]
) -> None:
    cls = COMMANDS[command]
    assert f"{path}:" in _refused(cls, path, wrong_type(ann), select)
    bad = out_of_range(field)
    if bad is not None:
        assert f"{path}:" in _refused(cls, path, bad, select)


def test_the_walk_covers_every_section() -> None:
    paths = {c[1] for c in CASES}
    assert len(CASES) > 150
    for section in ("trainer.actor.lr", "env.sampling.temperature", "engine.kv_cache_tokens",
                    "orchestrator.concurrency.max_inflight", "loop.steps", "pool.update_mode",
                    "eval.sampling.temperature", "dataset.path"):  # fmt: skip
        assert section in paths, section
