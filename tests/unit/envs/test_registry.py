"""Environment configs and the registry: names, validation with dotted paths, no torch import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tracerl.config import ConfigError
from tracerl.config.envs import CommandEnvConfig, DatasetConfig, parse_env_config
from tracerl.envs import ENVIRONMENTS, make_environment
from tracerl.envs.calculator import CalculatorEnvironment
from tracerl.envs.command import CommandEnvironment


@pytest.mark.parametrize("name", ["arithmetic", "concise", "calculator", "guess", "files"])
def test_builtin_environments_by_name(name: str) -> None:
    env = make_environment({"name": name, "sampling": {"temperature": 0.7}})
    assert env.name == name
    assert "prompt" in env.task_fields
    assert env.reward_fn is not None  # built-ins can also score a trace


# what each environment cannot do without (the adapters' packages are optional: the configs
# parse without them; making them is tested in tests/integration/test_env_*.py)
REQUIRED = {
    "command": {"argv": ["true"]},
    "reasoning-gym": {"dataset": "leg_counting"},
    "textarena": {"game": "GuessTheNumber-v0"},
    "verifiers": {"id": "vf-math"},
    "openenv": {"url": "http://127.0.0.1:8000"},
}
ADAPTERS = ("reasoning-gym", "textarena", "verifiers", "openenv")


def test_all_names_are_buildable() -> None:
    for name in ENVIRONMENTS:
        body = {"name": name, **REQUIRED.get(name, {})}
        if name in ADAPTERS:
            assert parse_env_config(body).name == name
        else:
            assert make_environment(body).name == name


def test_typed_configs_work_too() -> None:
    env = make_environment(parse_env_config({"name": "calculator", "max_turns": 2}))
    assert isinstance(env, CalculatorEnvironment) and env.config.max_turns == 2
    command = make_environment(CommandEnvConfig(argv=["agent"], reward_fn="arithmetic"))
    assert isinstance(command, CommandEnvironment) and command.reward_fn is not None
    assert make_environment(CommandEnvConfig(argv=["agent"])).reward_fn is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # paths as the caller wrote them: no variant tag ("calculator.max_turn") in them
        ({"name": "calculator", "max_turn": 3}, "  max_turn: unknown key"),
        ({"name": "arithmetic", "sampling": {"temp": 1}}, "  sampling.temp: unknown key"),
        ({"name": "command", "argv": []}, "  argv: List should have at least 1 item"),
        ({"name": "command"}, "  argv: Field required"),
        ({"name": "calculator", "max_turns": 0}, "  max_turns: Input should be greater"),
        ({"name": "chess"}, "  name: expected one of 'arithmetic', 'concise', 'calculator'"),
        ({"sampling": {}}, "  name: Field required (it chooses the variant)"),
    ],
)
def test_bad_configs_name_the_dotted_path(body: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_environment(body)
    assert message in str(err.value)


def test_a_bad_reward_fn_fails_when_the_environment_is_made() -> None:
    with pytest.raises(ValueError, match="reward_fn 'no_such_module_xyz:f': cannot import"):
        make_environment({"name": "command", "argv": ["a"], "reward_fn": "no_such_module_xyz:f"})


def test_dataset_config_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one of path and generate"):
        DatasetConfig()
    with pytest.raises(ValueError, match="exactly one of path and generate"):
        DatasetConfig(path="a.jsonl", generate="arithmetic")
    with pytest.raises(ValueError, match="extra"):
        DatasetConfig(path="a.jsonl", shufle=False)  # type: ignore[call-arg]


def test_config_module_does_not_import_torch() -> None:
    code = "import sys, tracerl.config.envs; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_task_generator_can_be_named_in_a_dataset() -> None:
    from tracerl.envs.registry import TASK_GENERATORS

    for name in TASK_GENERATORS:
        assert DatasetConfig(generate=name).generate == name  # type: ignore[arg-type]
