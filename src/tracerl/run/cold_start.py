"""The cold start of `tracerl train` (`[cold_start]`): demonstrations, SFT, then RL from there.

1. The environment's scripted policy plays `demonstrations` episodes of the training dataset
   through a gateway in front of no engine (`tracerl.gateway.demonstrations`): each is recorded
   in the run's trace store like any episode, and listed in `episodes.jsonl` with kind `demo`.
   A resumed run plays only the ones still missing.
2. `tracerl sft` trains on the recorded trajectories of the successful ones (`min_reward`), in
   RUN_DIR/cold_start (its own checkpoints, metrics and `export`); a resumed run resumes it.
   Once it has exported, its checkpoints are removed (only a resume of the SFT reads them).
3. RL starts from RUN_DIR/cold_start/export: the configuration's `trainer.model` is replaced by
   it for the engine, the trainer and the reference model alike.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from tracerl.config import ConfigError, LoggingConfig, TrainCommandConfig
from tracerl.config.sft import SftCommandConfig, SftConfig, SftDataConfig
from tracerl.run.episode_log import EpisodeLog, read_episodes
from tracerl.run.rollouts import DEMO

DIRECTORY = "cold_start"
CONCURRENT = 16
"""Demonstrations played at once (they wait on no engine: only on the environment's tools)."""


def played(run_dir: Path, min_reward: float | None = None) -> int:
    """Demonstration episodes the run has recorded (scored at least `min_reward`, if given)."""

    def good(reward: float | None) -> bool:
        return min_reward is None or (reward is not None and reward >= min_reward)

    return sum(
        row.get("kind") == DEMO and good(row.get("reward")) for row in read_episodes(run_dir)
    )


async def play_demonstrations(config: TrainCommandConfig, run_dir: Path, count: int) -> None:
    """Play `count` demonstrations (the dataset's first tasks after those already played)."""
    from tracerl.engine.server import start_server
    from tracerl.envs import load_dataset, make_environment
    from tracerl.gateway.demonstrations import NoEngine
    from tracerl.gateway.server import Gateway
    from tracerl.gateway.store import open_store
    from tracerl.models import load_tokenizer, model_eos_ids, resolve_model
    from tracerl.run.rollouts import EpisodeRunner

    c = config
    env = make_environment(c.env)
    if not getattr(env, "demonstrable", False):  # before anything is written
        raise ConfigError(
            f"cold_start.demonstrations: the {c.env.name} environment has no scripted "
            "policy to demonstrate (calculator, guess, files and reasoning-gym have one)"
        )
    dataset = load_dataset(c.dataset, env.task_fields, env)
    done = played(run_dir)
    dataset.seek(done)
    path = resolve_model(c.trainer.model)
    tokenizer = load_tokenizer(path, c.trainer.chat_template)
    store = await open_store(c.trace_store or str(run_dir / "traces.sqlite"))
    gateway = Gateway(
        NoEngine(),  # type: ignore[arg-type]  # demonstrated turns never reach it
        tokenizer,
        store,
        model_name=c.trainer.model,
        eos_ids=model_eos_ids(path, tokenizer),
        system_prompt=c.system_prompt,
        history=c.history,
        chat_format=c.trainer.chat_format,
    )
    runner_http, port = await start_server(gateway.app(), "127.0.0.1", 0)
    runner = EpisodeRunner(
        env, [f"http://127.0.0.1:{port}"], gateway.admin_key, store,
        timeout_s=c.loop.episode_timeout_s, model=c.trainer.model,
    )  # fmt: skip
    episodes = EpisodeLog(run_dir)
    slots = asyncio.Semaphore(CONCURRENT)
    rewards: list[float] = []

    async def one(position: int) -> None:
        task = dataset.next().task
        async with slots:
            rollout = await runner.run(task, position, DEMO, {})
        episodes.record(rollout, f"demo-{position}", 0, env.name)
        if rollout.result.reward is not None:
            rewards.append(rollout.result.reward)

    try:
        await asyncio.gather(*(one(done + i) for i in range(count)))
    finally:
        episodes.close()
        await runner.close()
        await runner_http.cleanup()
        await store.close()
    good = sum(r >= config.cold_start.min_reward for r in rewards)
    print(
        f"cold start: {count} demonstrations played, {good} scored at least "
        f"{config.cold_start.min_reward}",
        flush=True,
    )


def sft_config(config: TrainCommandConfig, run_dir: Path) -> SftCommandConfig:
    """`tracerl sft` on the run's successful demonstrations."""
    cs = config.cold_start
    actor = config.trainer.actor.model_copy(
        update={"lr": cs.lr, "schedule": "constant", "lr_warmup_steps": 0}
    )
    trainer = config.trainer.model_copy(
        update={"algorithm": "grpo", "kl_loss_coef": 0.0, "kl_reward_coef": 0.0, "actor": actor}
    )
    return SftCommandConfig(
        trainer=trainer,
        data=SftDataConfig(
            source="traces", runs=[str(run_dir)], kind=DEMO, reward_min=cs.min_reward
        ),
        sft=SftConfig(steps=cs.steps, epochs=cs.epochs, batch_size=cs.batch_size),
        logging=LoggingConfig(progress=config.logging.progress),
    )


def cold_start(config: TrainCommandConfig, run_dir: Path) -> TrainCommandConfig:
    """Run what is left of the cold start; the configuration RL then runs with."""
    from tracerl import eventloop
    from tracerl.sft.run import run_sft
    from tracerl.train.checkpoint import latest_checkpoint

    cs = config.cold_start
    if cs.demonstrations == 0:
        return config
    directory = run_dir / DIRECTORY
    export = directory / "export"
    if not (export / "config.json").exists():
        missing = cs.demonstrations - played(run_dir)
        if missing > 0:
            eventloop.run(play_demonstrations(config, run_dir, missing))
        if played(run_dir, cs.min_reward) == 0:
            raise ConfigError(
                f"cold_start.min_reward: none of the {cs.demonstrations} demonstrations scored "
                f"{cs.min_reward} or more (their records: {run_dir / 'episodes.jsonl'}, kind demo)"
            )
        directory.mkdir(exist_ok=True)
        resume = latest_checkpoint(directory / "checkpoints") is not None
        status = run_sft(sft_config(config, run_dir), directory, resume=resume)
        if status != 0:
            raise KeyboardInterrupt  # stopped mid-SFT: checkpointed, resumable
        # only a resume of the SFT needs them (weights and optimizer state, ~12 bytes per
        # parameter each); the export is what RL starts from
        shutil.rmtree(directory / "checkpoints", ignore_errors=True)
    # validated again: the engine's model follows the trainer's (a copy would keep the old one)
    data = config.model_dump(mode="json", exclude_unset=True)
    data.setdefault("trainer", {})["model"] = str(export)
    data.get("engine", {}).pop("model", None)
    return TrainCommandConfig.model_validate(data)
