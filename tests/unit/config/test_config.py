import pytest

from tracerl.config import (
    ConfigError,
    EngineCommandConfig,
    field_help,
    load_config,
    parse_overrides,
    save_resolved_config,
)


def test_overrides_nest_and_parse_toml_literals() -> None:
    assert parse_overrides(["--engine.kv_cache_tokens=4096", "engine.model=tiny", "a.b=true"]) == {
        "engine": {"kv_cache_tokens": 4096, "model": "tiny"},
        "a": {"b": True},
    }


@pytest.mark.parametrize("bad", ["noequals", "=1", "a..b=1"])
def test_malformed_override_is_rejected(bad: str) -> None:
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        parse_overrides([bad])


def test_file_then_overrides(tmp_path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text(
        '[engine]\nmodel = "smollm2-135m"\nkv_cache_tokens = 1024\n[server]\nport = 0\n'
    )
    config = load_config(EngineCommandConfig, path, ["engine.kv_cache_tokens=2048"])
    assert config.engine.model == "smollm2-135m"
    assert config.engine.kv_cache_tokens == 2048
    assert config.server.port == 0
    assert config.server.host == "127.0.0.1"


def test_errors_name_every_dotted_path() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            EngineCommandConfig,
            None,
            ["engine.kv_cache_tokens=abc", "engine.bogus=1", "server.port=70000"],
        )
    text = str(err.value)
    assert "engine.kv_cache_tokens: Input should be a valid integer" in text
    assert "engine.bogus: unknown key" in text
    assert "server.port: Input should be less than or equal to 65535" in text


def test_bounds_and_literals() -> None:
    with pytest.raises(ConfigError, match="engine.kv_cache_tokens: Input should be greater"):
        load_config(EngineCommandConfig, None, ["engine.kv_cache_tokens=0"])
    with pytest.raises(ConfigError, match="engine.device"):
        load_config(EngineCommandConfig, None, ["engine.device=tpu"])


def test_missing_and_invalid_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(EngineCommandConfig, tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(EngineCommandConfig, bad)


def test_every_field_is_documented() -> None:
    rows = field_help(EngineCommandConfig)
    assert {r[0] for r in rows} >= {"engine.model", "engine.kv_cache_tokens", "server.port"}
    assert all(doc for _, _, _, doc in rows), [r[0] for r in rows if not r[3]]


def test_resolved_config_round_trips_through_the_run_directory(tmp_path) -> None:
    config = load_config(EngineCommandConfig, None, ["engine.kv_cache_tokens=512"])
    path = save_resolved_config(config, tmp_path / "run")
    assert path == tmp_path / "run" / "config.json"
    reloaded = EngineCommandConfig.model_validate_json(path.read_text())
    assert reloaded == config
    assert reloaded.server.host == "127.0.0.1"  # defaults are written out, not implied


def test_the_lr_horizon_follows_the_loop_unless_given() -> None:
    from tracerl.config import TrainCommandConfig

    assert load_config(TrainCommandConfig, None, ["loop.steps=7"]).trainer.total_steps == 7
    assert load_config(TrainCommandConfig, None, []).trainer.total_steps == 20  # loop's default
    given = load_config(TrainCommandConfig, None, ["loop.steps=7", "trainer.total_steps=50"])
    assert given.trainer.total_steps == 50  # a longer horizon may be meant (a later resume)
    # warmup is checked against the derived horizon
    with pytest.raises(ConfigError, match=r"actor.lr_warmup_steps \(30\) exceeds total_steps"):
        load_config(TrainCommandConfig, None, ["trainer.actor.lr_warmup_steps=30"])
    # a decay to 0 before the loop ends trains nothing after it: refused, naming both fields
    decays = ["loop.steps=10", "trainer.total_steps=5", "trainer.actor.schedule=linear"]
    with pytest.raises(ConfigError, match=r"trainer.total_steps \(5\) is below loop.steps \(10\)"):
        load_config(TrainCommandConfig, None, decays)
    held = load_config(TrainCommandConfig, None, [*decays, "trainer.actor.min_lr_ratio=0.1"])
    assert held.trainer.total_steps == 5
