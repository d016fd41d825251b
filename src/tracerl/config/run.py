"""Configuration of `tracerl train CONFIG.toml`: the RL loop and everything it starts.

One model name (`trainer.model`) drives the embedded engine, the gateway's tokenizer and the
trainer; sections for the engine and gateway hold only what is theirs. No torch here.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from tracerl.config.base import Config
from tracerl.config.cluster import ClusterConfig, is_loopback
from tracerl.config.control import OrchestratorConfig
from tracerl.config.engine import EngineConfig
from tracerl.config.envs import DatasetConfig, EnvConfig
from tracerl.config.pool import PoolConfig
from tracerl.config.telemetry import TelemetryConfig
from tracerl.config.train import TrainerConfig


class LoopConfig(Config):
    steps: int = Field(default=20, ge=0)
    """Training steps to run (a resumed run continues up to this many in total). 0 trains
    nothing: the run evaluates its starting weights on `eval_dataset` once and ends (the held-out
    score of a model or an export: `--trainer.model=DIR --loop.steps=0`)."""
    max_off_policy_steps: int = Field(default=1, ge=0)
    """How many weight versions a trajectory may lag the step that trains on it; older ones are
    dropped and counted. 0 is synchronous: rollouts for step n+1 start after step n's weights
    are in the engines."""
    engines_while_training: Literal["auto", "run", "pause"] = "auto"
    """What the engines do while a step trains: run (rollouts overlap training), or pause in
    place (requests keep their KV; the new weights are pushed before they resume). auto pauses
    embedded engines when the trainer is on the CPU too: two torch thread pools on the same
    cores slow each other down (measured on 2 cores: 24 steps in 4 minutes paused, 22 running,
    and a tenth of the groups went stale; README)."""
    episode_timeout_s: float = Field(default=600.0, gt=0)
    """An episode running longer fails (with its reason) and never reaches the trainer."""
    checkpoint_every: int = Field(default=1, ge=1)
    """Save a checkpoint every this many steps (and at the end, and on Ctrl-C)."""
    snapshot_every: int | None = Field(default=None, ge=1)
    """Also write the actor's weights every this many steps (and at the end, and on Ctrl-C)
    as `tracerl export` writes them, to `RUN_DIR/snapshots/step_N`: a Hugging Face directory
    to evaluate offline, without the optimizer state a checkpoint holds (SmolLM2-135M: 0.6 GB
    in 0.4-1.5 s, a checkpoint 1.7 GB in 5-7 s), so it cannot resume a run. All are kept.
    Unset: none."""
    max_minutes: float | None = Field(default=None, gt=0)
    """Wall-clock budget from process start (model loading included): once it has passed, the
    step in progress finishes, the run checkpoints, runs its final eval and ends. Unset: no
    budget (`steps` alone ends the run)."""
    seed: int = 0
    """Seeds episode sampling seeds and the dataset order (with the dataset's own seed)."""


class EvalSamplingConfig(Config):
    """How eval episodes sample: greedy by default, whatever the training temperature."""

    temperature: float = Field(default=0.0, ge=0)
    """0 is greedy decoding (deterministic for the same weights)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Completion budget of one eval turn; unset: the environment's `sampling.max_tokens`."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling for eval; unset leaves the engine's default."""


class EvalConfig(Config):
    """Held-out evaluation on `eval_dataset`: never trained on, never shed by the controller."""

    every: int = Field(default=0, ge=0)
    """Evaluate before the first step and every this many steps, and at the end (0: never)."""
    samples: int = Field(default=1, ge=1)
    """k: samples per task. `eval/accuracy` is the mean success over all samples, `eval/pass@k`
    the share of tasks with at least one success."""
    success_reward: float = 1.0
    """A sample succeeds when its reward is at least this (for pass@k and accuracy)."""
    sampling: EvalSamplingConfig = Field(default_factory=EvalSamplingConfig)
    by: str | None = None
    """A task field (a string or number in every eval task): each eval also logs the accuracy
    over the tasks of each of its values, `eval/accuracy/FIELD=VALUE` (a generated task's
    difficulty, such as the guessing game's `high` or the file search's `depth`), so a curve
    shows which kind of task the success comes from."""

    @model_validator(mode="after")
    def _distinct_samples(self) -> Self:
        if self.samples > 1 and self.sampling.temperature == 0:
            raise ValueError(
                f"eval.samples is {self.samples} but eval.sampling.temperature is 0: greedy "
                "samples are all the same; set a temperature for pass@k"
            )
        return self


class LoggingConfig(Config):
    progress: bool = True
    """A live progress line on the terminal (step, reward, tokens/s, in-flight cap, ETA)."""
    tensorboard: bool = False
    """Also write TensorBoard event files under RUN_DIR/tensorboard (needs `tensorboard`)."""
    wandb_project: str | None = None
    """Also log to this Weights & Biases project (needs `wandb` and a login)."""


class ColdStartConfig(Config):
    """Before RL: the environment's scripted policy plays `demonstrations` episodes through
    the gateway (recorded as traces, `kind` demo), the model is fine-tuned on the successful
    ones (`tracerl sft` on those traces, in RUN_DIR/cold_start), and RL starts from the
    result. For a model that would otherwise never use the environment's tools."""

    demonstrations: int = Field(default=0, ge=0)
    """Demonstration episodes to play (0: no cold start). Tasks come from `dataset`."""
    steps: int | None = Field(default=None, ge=1)
    """SFT steps; unset: `epochs` passes over the demonstrations."""
    epochs: float = Field(default=1.0, gt=0)
    batch_size: int = Field(default=16, ge=1)
    """Trajectories per SFT step."""
    lr: float = Field(default=1e-5, gt=0)
    """The SFT learning rate (constant; RL then uses `trainer.actor.lr`)."""
    min_reward: float = 1.0
    """Only demonstrations scored at least this are trained on."""


class TrainCommandConfig(Config):
    """`tracerl train`: dataset -> dispatcher -> environments through the gateway -> traces ->
    rewards -> trainer -> weight sync, step after step."""

    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    env: EnvConfig = Field(default_factory=lambda: _default_env())
    dataset: DatasetConfig = Field(default_factory=lambda: DatasetConfig(generate="arithmetic"))
    eval_dataset: DatasetConfig | None = None
    """Held-out tasks for `[eval]`; unset with eval.every > 0 is a config error."""
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    loop: LoopConfig = Field(default_factory=LoopConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """The embedded inference engine (its `model` is always `trainer.model`)."""
    pool: PoolConfig = Field(default_factory=PoolConfig)
    system_prompt: str | None = None
    """Prepended by the gateway to every session (recorded like any prompt token)."""
    history: Literal["extend", "template"] = "extend"
    """A chat template that renders an earlier reply differently than it was sampled (Qwen3's
    and GLM's drop reasoning once a user message follows): `extend` keeps the episode one
    trajectory (the recorded tokens, then the template's rendering of the new messages),
    `template` renders as the template does and starts a new trajectory
    (`tracerl.gateway.session`)."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    trace_store: str | None = None
    """Where the gateway records turns and the loop reads them back: unset, the run's
    `traces.sqlite`; a `postgresql://user@host:port/db` URL for a PostgreSQL server (the
    `[postgres]` extra)."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Where the trainer ranks and engines run: this process, or a Ray cluster."""
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    """OpenTelemetry spans to an OTLP collector (off unless `otlp_endpoint` is set)."""
    cold_start: ColdStartConfig = Field(default_factory=ColdStartConfig)
    """Demonstrations and SFT before RL (off unless `demonstrations` is set)."""

    @model_validator(mode="before")
    @classmethod
    def _schedule_follows_the_loop(cls, data: Any) -> Any:
        """`trainer.total_steps` (the LR schedules' horizon) defaults to `loop.steps`."""
        if not isinstance(data, dict):
            return data
        trainer = data.get("trainer")
        trainer = trainer.model_dump() if isinstance(trainer, TrainerConfig) else trainer
        trainer = dict(trainer) if isinstance(trainer, dict) else {}
        if "total_steps" not in trainer:
            loop = data.get("loop")
            steps = loop.steps if isinstance(loop, LoopConfig) else (loop or {}).get("steps")
            steps = steps if steps is not None else LoopConfig().steps
            # an eval-only run (0 steps) has no schedule; a wrong type is the loop's to report
            trainer["total_steps"] = 1 if steps == 0 else steps
            data = {**data, "trainer": trainer}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        total, steps = self.trainer.total_steps, self.loop.steps
        for name, optim in (("actor", self.trainer.actor), ("critic", self.trainer.critic)):
            if total < steps and optim.schedule != "constant" and optim.min_lr_ratio == 0:
                raise ValueError(
                    f"trainer.total_steps ({total}) is below loop.steps ({steps}): the "
                    f"{optim.schedule} trainer.{name} schedule reaches lr 0 at step {total} and "
                    "trains nothing after it; leave total_steps unset to follow loop.steps, or "
                    f"set trainer.{name}.min_lr_ratio"
                )
        ranks = self.cluster.trainer.ranks
        if ranks > 1 and self.cluster.backend != "ray":
            raise ValueError(
                f"cluster.trainer.ranks is {ranks} but cluster.backend is 'local': trainer "
                "ranks are placed by Ray (cluster.backend = 'ray')"
            )
        if ranks > 1 and self.trainer.lora is not None:
            raise ValueError(
                f"trainer.lora is set with cluster.trainer.ranks = {ranks}: LoRA trains on one "
                "rank for now (FSDP2 sharding of adapters is not supported yet)"
            )
        lora, engine = self.trainer.lora, self.engine
        if lora is not None and engine.backend in ("vllm", "sglang"):
            if engine.lora_rank == 0:  # the run's servers take its adapters
                engine.lora_rank = lora.rank
            elif engine.lora_rank < lora.rank:
                raise ValueError(
                    f"engine.lora_rank ({engine.lora_rank}) is below trainer.lora.rank "
                    f"({lora.rank}): the {engine.backend} servers could not load the adapters"
                )
        if ranks > self.orchestrator.batch_size:
            raise ValueError(
                f"cluster.trainer.ranks ({ranks}) is above orchestrator.batch_size "
                f"({self.orchestrator.batch_size}): each rank trains on at least one trajectory "
                "of a step"
            )
        if not is_loopback(self.cluster.bind) and self.engine.api_key is None:
            raise ValueError(
                f"cluster.bind is {self.cluster.bind!r}: engines reachable beyond this machine "
                "need engine.api_key (every engine then requires it, and the pool sends it)"
            )
        if self.eval.every and self.eval_dataset is None:
            raise ValueError("eval.every is set but eval_dataset is not")
        if self.eval.by is not None and self.eval_dataset is None:
            raise ValueError("eval.by is set but eval_dataset is not")
        if self.loop.steps == 0 and not self.eval.every:
            raise ValueError(
                "loop.steps is 0, which only evaluates the starting weights, but eval.every is 0 "
                "(never): set eval.every (and eval_dataset)"
            )
        if self.trainer.algorithm != "ppo" and self.orchestrator.group_size < 2:
            raise ValueError(
                f"orchestrator.group_size is {self.orchestrator.group_size} but "
                f"trainer.algorithm {self.trainer.algorithm!r} compares samples within a group: "
                "use group_size >= 2, or algorithm='ppo' (a critic learns from groups of one)"
            )
        if self.engine.model != self.trainer.model:
            if "model" in self.engine.model_fields_set:
                raise ValueError(
                    f"engine.model ({self.engine.model!r}) differs from trainer.model "
                    f"({self.trainer.model!r}): the engine serves the trained policy"
                )
            self.engine = self.engine.model_copy(update={"model": self.trainer.model})
        sampling = getattr(self.env, "sampling", None)
        if sampling is not None and sampling.temperature != self.trainer.temperature:
            raise ValueError(
                f"env.sampling.temperature ({sampling.temperature}) differs from "
                f"trainer.temperature ({self.trainer.temperature}): log-probs are recomputed "
                "at the rollout temperature, so they must match"
            )
        return self


def _default_env() -> EnvConfig:
    from tracerl.config.envs import ArithmeticEnvConfig

    return ArithmeticEnvConfig()
