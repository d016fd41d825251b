"""Every shipped config parses with its command's schema, and its stated invariants hold."""

from pathlib import Path

import pytest

from tracerl.config import EngineCommandConfig, SftCommandConfig, TrainCommandConfig, load_config

EXAMPLES = Path(__file__).parents[2] / "examples"
ENGINE = sorted(EXAMPLES.glob("engine*.toml"))
TRAIN = sorted(p for p in EXAMPLES.glob("*.toml") if not p.name.startswith("engine"))


@pytest.mark.parametrize("path", ENGINE, ids=lambda p: p.name)
def test_shipped_engine_configs_parse(path: Path) -> None:
    config = load_config(EngineCommandConfig, path)
    assert config.server.host == "127.0.0.1"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("sft/*.toml")), ids=lambda p: p.name)
def test_shipped_sft_configs_parse(path: Path) -> None:
    config = load_config(SftCommandConfig, path)
    assert config.trainer.algorithm == "grpo"  # no critic is built
    if config.data.path is not None:
        assert (EXAMPLES.parent / config.data.path).is_file()


@pytest.mark.parametrize("path", TRAIN, ids=lambda p: p.name)
def test_shipped_train_configs_parse_and_hold(path: Path) -> None:
    config = load_config(TrainCommandConfig, path)
    assert config.orchestrator.batch_size % config.orchestrator.group_size == 0
    assert config.engine.model == config.trainer.model
    assert config.trainer.total_steps >= config.loop.steps  # the LR schedule spans the run
    if config.trainer.algorithm != "ppo":
        assert config.orchestrator.group_size >= 2  # a group baseline needs a group


def test_the_issue_s_configs_are_shipped() -> None:
    names = {p.name for p in TRAIN}
    assert {"quickstart.toml", "ppo.toml", "agent.toml", "tiny.toml"} <= names
    ppo = load_config(TrainCommandConfig, EXAMPLES / "ppo.toml")
    assert ppo.trainer.algorithm == "ppo" and ppo.trainer.critic_warmup_steps > 0
    assert ppo.trainer.kl_reward_coef > 0 and ppo.trainer.gamma == 1.0
    assert ppo.trainer.critic.lr > ppo.trainer.actor.lr
    assert load_config(TrainCommandConfig, EXAMPLES / "agent.toml").env.name == "calculator"
    quickstart = load_config(TrainCommandConfig, EXAMPLES / "quickstart.toml")
    assert quickstart.trainer.model == "smollm2-135m" and quickstart.trainer.algorithm == "grpo"


def test_the_lora_example_is_the_quickstart_with_adapters() -> None:
    lora = load_config(TrainCommandConfig, EXAMPLES / "lora.toml")
    quickstart = load_config(TrainCommandConfig, EXAMPLES / "quickstart.toml")
    assert lora.trainer.lora is not None and lora.trainer.lora.rank == 16
    assert quickstart.trainer.lora is None
    assert lora.trainer.actor.lr > 5 * quickstart.trainer.actor.lr  # adapters need a higher lr
    assert lora.env == quickstart.env and lora.orchestrator == quickstart.orchestrator
