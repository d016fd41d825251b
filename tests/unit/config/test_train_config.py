import subprocess
import sys

import pytest

from tracerl.config import ConfigError, field_help, load_config
from tracerl.config.train import TrainerConfig


def test_both_kl_paths_at_once_is_an_error_naming_both_fields() -> None:
    with pytest.raises(ConfigError, match="kl_loss_coef and kl_reward_coef are both set"):
        load_config(TrainerConfig, None, ["kl_loss_coef=0.1", "kl_reward_coef=0.1"])
    assert load_config(TrainerConfig, None, ["kl_reward_coef=0.1"]).uses_reference
    assert load_config(TrainerConfig, None, ["algorithm='grpo'", "kl_loss_coef=0.1"]).uses_reference


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm='grpo'", "kl_reward_coef=0.1"], "kl_reward_coef needs algorithm='ppo'"),
        (["algorithm='rloo'", "critic_warmup_steps=2"], "critic_warmup_steps needs"),
        (["total_steps=5", "actor.lr_warmup_steps=6"], r"actor.lr_warmup_steps \(6\) exceeds"),
        (["critic.epochs=0"], "critic.epochs: Input should be greater than or equal to 1"),
        (["dual_clip=1.0"], "dual_clip: Input should be greater than 1"),
        (["algorithm='a2c'"], "algorithm: Input should be 'ppo', 'grpo', 'dr_grpo' or 'rloo'"),
        (["actor.bogus=1"], "actor.bogus: unknown key"),
    ],
)
def test_invalid_configs_name_their_fields(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(TrainerConfig, None, overrides)


def test_every_field_is_documented_and_defaults_are_sane() -> None:
    rows = field_help(TrainerConfig)
    assert all(doc for *_, doc in rows), [r[0] for r in rows if not r[3]]
    config = TrainerConfig()
    assert config.gamma == 1.0 and config.algorithm == "ppo" and config.uses_critic
    # the pair `tracerl bench learn`'s PPO runs used: the critic never slower than the actor
    assert config.critic.lr >= config.actor.lr == 5e-6
    defaults = {path: default for path, _, default, _ in rows}
    assert defaults["critic.lr"] == repr(config.critic.lr)  # --help shows the real default
    assert not config.uses_reference


def test_the_trainer_config_does_not_import_torch() -> None:
    code = "import sys, tracerl.config.train; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_lora_run_enables_lora_on_its_vllm_and_sglang_servers() -> None:
    from tracerl.config import TrainCommandConfig
    from tracerl.run.engines import adapter_sync

    for backend in ("vllm", "sglang"):
        config = TrainCommandConfig.model_validate(
            {"engine": {"backend": backend}, "trainer": {"lora": {"rank": 8}}}
        )
        assert config.engine.lora_rank == 8 and adapter_sync(config)
        with pytest.raises(ValueError, match=r"engine.lora_rank \(4\) is below trainer.lora.rank"):
            TrainCommandConfig.model_validate(
                {"engine": {"backend": backend, "lora_rank": 4}, "trainer": {"lora": {"rank": 8}}}
            )
    full = TrainCommandConfig.model_validate({"engine": {"backend": "vllm"}})
    assert full.engine.lora_rank == 0 and not adapter_sync(full)
    sim = TrainCommandConfig.model_validate(
        {"engine": {"backend": "sim"}, "trainer": {"lora": {"rank": 8}}}
    )
    assert not adapter_sync(sim)  # no weights to take
