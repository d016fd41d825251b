from pathlib import Path

import pytest

from tracerl.config import EngineCommandConfig, load_config

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("engine*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_shipped_engine_configs_parse(path: Path) -> None:
    config = load_config(EngineCommandConfig, path)
    assert config.server.host == "127.0.0.1"


def test_there_are_examples() -> None:
    assert EXAMPLES
