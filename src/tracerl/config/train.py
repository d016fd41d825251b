"""Configuration of the trainer (`tracerl.train`): models, algorithm, optimisation per model,
batching, KL, checkpoints. No torch here: the CLI validates this before any heavy import."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from tracerl.config.base import Config
from tracerl.config.gateway import ChatFormatName

Algorithm = Literal["ppo", "grpo", "dr_grpo", "rloo"]
LossAgg = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]

# Fields that may differ between a checkpoint and the run resuming it: they change neither the
# numbers a step computes nor the shapes of anything saved.
RESUME_SAFE_FIELDS = frozenset({"keep_last_n", "offload_models", "total_steps"})
# What one more micro-batch is worth in padded tokens, as a fraction of token_budget: a guess
# between CPUs (compute per token dominates: split freely) and GPUs (a small micro-batch leaves
# the device idle).
DEFAULT_BUCKET_SPLIT_COST = 1 / 32


class OptimizerConfig(Config):
    """AdamW, its learning-rate schedule and how often one batch is reused, for one model."""

    lr: float = Field(default=5e-6, gt=0)
    """Peak learning rate. The default is measured (`tracerl bench learn`'s hard task, GRPO,
    15 minutes): 5e-6 reached 60 % held-out accuracy in ~6 minutes, 1e-6 in ~11, both ended at
    65-72 %; 2e-5 ended lower (61 %)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay."""
    beta1: float = Field(default=0.9, ge=0, lt=1)
    """AdamW first-moment decay."""
    beta2: float = Field(default=0.999, ge=0, lt=1)
    """AdamW second-moment decay."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW denominator epsilon."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Shape of the rate after warmup, down to lr * min_lr_ratio at total_steps."""
    lr_warmup_steps: int = Field(default=0, ge=0)
    """Trainer steps of linear learning-rate warmup (not critic warmup: see critic_warmup_steps)."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Floor of the decayed rate, as a fraction of lr; held past total_steps."""
    epochs: int = Field(default=1, ge=1)
    """Passes over each step's batch."""
    mini_batches: int = Field(default=1, ge=1)
    """Optimizer updates per pass (the batch is shuffled and cut into this many parts; capped
    at the number of trajectories)."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Clip the gradient to this global norm; unset: no clipping."""
    skip_grad_norm: float | None = Field(default=None, gt=0)
    """Skip an update (and its schedule step) whose gradient norm exceeds this; non-finite
    norms are always skipped."""


class CriticOptimizerConfig(OptimizerConfig):
    """The critic's optimisation: the actor's fields, with a higher default rate."""

    lr: float = Field(default=5e-6, gt=0)
    """Peak learning rate (the actor's: what `tracerl bench learn`'s PPO runs used; the critic
    starts from the actor's weights and a fresh value head)."""


ALL_LINEAR = "all-linear"


class MoeConfig(Config):
    """Mixture-of-experts models (`tracerl.routing`, `tracerl.train.replay`)."""

    routing: Literal["replay", "recompute"] = "replay"
    """`replay`: the gateway records which experts the engine routed every token to, and the
    trainer's forwards (actor, reference, critic) use that routing instead of choosing their
    own top-k (the routers' probabilities are still computed at the recorded experts, so
    their gradient remains); positions without a record (the last token, a turn from an engine
    that returns none) use the model's own choice. `recompute`: nothing is recorded, the
    trainer routes by itself. A dense model has no routers: either is the same, and free."""


class LoraConfig(Config):
    """Low-rank adapters (LoRA, through peft) trained in place of the full weights
    (`tracerl.train.lora`): the base weights stay frozen, the optimizer holds the adapters only,
    checkpoints hold the adapters and their optimizer state."""

    rank: int = Field(default=16, ge=1)
    """Rank r of each adapter pair (A: r x in, B: out x r)."""
    alpha: int | None = Field(default=None, gt=0)
    """Scale numerator: an adapter adds (alpha / rank) * B @ A to its layer; unset: 2 * rank."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input during the updates' forwards only (the no-grad passes,
    reference and behaviour log-probs, and the engines never drop)."""
    target_modules: list[str] = Field(default_factory=lambda: [ALL_LINEAR])
    """The layers that get adapters: module names or suffixes (`["q_proj", "v_proj"]`), or
    `["all-linear"]`, every linear layer but the output layer. Embeddings cannot take
    adapters."""
    critic: Literal["lora", "full"] = "lora"
    """ppo: the critic trains adapters of its own on the same frozen base (which it shares with
    the actor: no second copy) plus its value head, or all of its weights."""

    @property
    def scale_alpha(self) -> int:
        return self.alpha if self.alpha is not None else 2 * self.rank

    @model_validator(mode="after")
    def _targets(self) -> Self:
        if not self.target_modules:
            raise ValueError("target_modules is empty: name layers, or use 'all-linear'")
        if ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            raise ValueError(f"target_modules: {ALL_LINEAR!r} stands alone (it names them all)")
        return self


class TrainerConfig(Config):
    model: str = "smollm2-135m"
    """Actor: a built-in name (smollm2-135m, gemma3-270m, tiny), a Hugging Face directory or a
    .gguf file; the critic and the reference model derive from it."""
    chat_template: str | None = None
    """The chat template the gateway renders with, replacing the tokenizer's own (a model
    without one needs it): a built-in name (chatml, gemma: `tracerl.chat_templates`) or a Jinja
    file. Exports (`tracerl export`) carry it."""
    chat_format: ChatFormatName = "auto"
    """How the model's replies write tool calls and reasoning (`tracerl.formats`): `auto`
    reads it from the chat template; or hermes, qwen3_coder, llama3, mistral, deepseek, glm,
    harmony."""
    algorithm: Algorithm = "ppo"
    """ppo (learned critic, GAE) or a group baseline: grpo, dr_grpo, rloo."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of every model (log-probs, losses and advantages are float32 anyway)."""
    autocast: Literal["off", "bfloat16"] = "off"
    """Mixed precision: `bfloat16` runs the trainer's forwards (actor, critic, reference)
    under bfloat16 autocast, so their matrix multiplies are bfloat16 while the weights, the
    gradients, the optimizer state, log-probs and losses stay float32 (TRL's `bf16 = true`).
    Where the hardware multiplies bfloat16 natively (CUDA; CPUs with AVX512-BF16 or AMX) a
    step is faster (2.44x for SmolLM2's GRPO step on an AVX512-BF16 CPU: docs/trainer.md);
    log-probs move by bfloat16's rounding, which the `mismatch/` metrics show and truncated
    importance sampling bounds. The weight probe scores in float32 regardless."""
    seed: int = 0
    """Seeds the critic head, mini-batch shuffling and torch's generators."""
    temperature: float = Field(default=1.0, ge=0)
    """Rollout sampling temperature: log-probs are log_softmax(logits / T), as the engine
    reports them (0: greedy, reported at T = 1)."""
    total_steps: int = Field(default=1000, ge=1)
    """Trainer steps the learning-rate schedules span; `tracerl train` sets it to `loop.steps`
    unless given. A resume may change it (a longer run): the schedules continue from their
    position on the new horizon."""
    actor: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """Actor optimisation."""
    moe: MoeConfig = Field(default_factory=MoeConfig)
    """`[trainer.moe]`: routing replay for mixture-of-experts models."""
    lora: LoraConfig | None = None
    """`[trainer.lora]`: train low-rank adapters instead of the full weights; unset: full
    fine-tuning."""
    critic: CriticOptimizerConfig = Field(default_factory=CriticOptimizerConfig)
    """Critic optimisation (ppo only)."""
    token_budget: int = Field(default=8192, ge=2)
    """Tokens per micro-batch; gradients accumulate over micro-batches with one denominator
    per optimizer update. A longer trajectory gets a micro-batch of its own."""
    batching: Literal["auto", "pack", "bucket", "pad"] = "auto"
    """How micro-batches are laid out: pack (trajectories concatenated in rows, no padding),
    bucket (grouped by length, padded to their micro-batch's longest), pad (naive: all padded
    to the batch's longest; the benchmark baseline). auto: pack with a flash-attention
    implementation, which attends within packed rows for free, else bucket (SDPA would pay
    for attention across the samples of a packed row)."""
    share_prefix: bool = True
    """bucket: forward the prompt a group's samples share once per micro-batch row (a tree
    attention mask) instead of once per sample; the outputs are the same. With 8 samples of a
    50-token prompt and 12-token answers it cuts the tokens processed ~3x. Off for a model
    with a sliding window (the tree mask would replace its windowed one)."""
    bucket_split_cost: float = Field(default=DEFAULT_BUCKET_SPLIT_COST, ge=0)
    """bucket: padded tokens one more micro-batch is worth, as a fraction of token_budget
    (lower where compute per token dominates, as on CPUs)."""
    clip_low: float = Field(default=0.2, ge=0)
    """PPO ratio clip below 1 (epsilon low)."""
    clip_high: float = Field(default=0.2, ge=0)
    """PPO ratio clip above 1 (epsilon high; > clip_low is clip-higher)."""
    dual_clip: float | None = Field(default=None, gt=1)
    """Dual-clip bound c on the loss of negative-advantage tokens; unset: off."""
    tis_cap: float | None = Field(default=2.0, gt=0)
    """Cap of the truncated importance weight exp(old - rollout log-prob); unset: no
    truncation."""
    loss_agg: LossAgg = "token_mean"
    """How per-token losses reduce (one global denominator per update)."""
    value_clip: float | None = Field(default=0.2, gt=0)
    """Trust region of the clipped value loss around the pre-update values; unset: plain MSE."""
    gamma: float = Field(default=1.0, ge=0, le=1)
    """GAE discount over action tokens (1.0 is standard for RLHF: the reward is terminal)."""
    lam: float = Field(default=1.0, ge=0, le=1)
    """GAE lambda. 1.0 (the default since the agentic benchmarks; 0.95 before): a terminal
    reward reaches every action token undiminished, and the critic's targets are the returns
    themselves. At 0.95 a success's reward reaches a decision 100 action tokens before the
    answer as 0.95^100 = 0.006 of it, the rest of its advantage being the critic's estimate:
    on the multi-turn `files` task PPO at 0.95 fell from 22 % to 0 % held-out success (seed 0,
    twice), at 1.0 it held the start on three seeds; on the calculator (3 seeds, one start)
    0.95 ended at 12, 0 and 18 %, 1.0 at 80, 74 and 100 %; on `guess` and `medium` (one seed
    each) 1.0 ended within noise of 0.95 (docs/benchmarks.md)."""
    whiten_advantages: bool = True
    """ppo: whiten GAE advantages over the batch's action tokens before the actor update."""
    whiten_uniform_batches: bool = False
    """ppo, with whiten_advantages: also whiten a batch whose episodes all have the same reward.
    Such a batch's advantages are only the critic's errors (and any KL term), and whitening
    scales them to unit spread, a full-size update on noise (on `files`, actor gradient norms
    of 0.6-1.2 on such steps, 0.03-0.06 unwhitened: docs/benchmarks.md). False (the default)
    trains such a batch on its advantages as they are; true whitens every batch, as the usual
    PPO does."""
    zero_uniform_batches: bool = False
    """ppo: give a batch whose episodes all have the same reward advantage 0 (without
    KL-in-reward, whose per-token terms differ), as a group baseline gives a group whose
    episodes all scored the same. Such a batch's advantages are then only the critic's errors,
    and its actor update follows them; with this set, the actor's update is the optimizer's
    step on a zero gradient (its momentum carries on, the schedule advances), without an actor
    forward unless a KL loss needs one, and the critic still trains on the batch. False (the
    default) trains the actor on such a batch's advantages as they are."""
    std_normalize: bool = True
    """grpo: divide by the group's reward standard deviation."""
    filter_uniform_groups: bool = False
    """Group baselines: true has the loop drop groups whose rewards are all equal (advantage 0)
    as they complete, so a step waits for groups with signal and its loss is normalised over
    them alone (the trainer itself trains on whatever samples it is given);
    false (the default) trains every step on the next complete groups, as TRL does: samples
    with advantage 0 count in the loss denominator but are never forwarded (their gradient is
    exactly 0 without a KL loss), and a step with no signal still steps the optimizer, whose
    momentum carries the last signal on."""
    critic_warmup_steps: int = Field(default=0, ge=0)
    """ppo: the first steps train only the critic (no actor forward, update or schedule step)."""
    kl_loss_coef: float = Field(default=0.0, ge=0)
    """Coefficient of KL(actor || reference) added to the actor loss (group baselines, or ppo
    without kl_reward_coef)."""
    kl_reward_coef: float = Field(default=0.0, ge=0)
    """ppo: beta of KL-in-reward, subtracted from action-token rewards before GAE, so the value
    targets carry the penalty."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator for either KL path."""
    kl_behavior_logprobs: Literal["recompute", "rollout"] = "recompute"
    """KL-in-reward: the actor's log-probs recomputed (an extra actor forward) or the
    rollout's (measures the train/inference mismatch too). Critic warmup always uses the
    rollout's."""
    offload_models: bool = True
    """On CUDA, keep models not used by the current phase (and their optimizer state) on the
    host; ignored on CPU."""
    keep_last_n: int = Field(default=2, ge=1)
    """Checkpoints kept; older ones are deleted after each save."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.kl_loss_coef > 0 and self.kl_reward_coef > 0:
            raise ValueError(
                "kl_loss_coef and kl_reward_coef are both set: the loss term reaches only the "
                "policy gradient, the reward term also shapes the value targets; choose one"
            )
        if self.algorithm != "ppo":
            if self.kl_reward_coef > 0:
                raise ValueError(
                    f"kl_reward_coef needs algorithm='ppo' (a critic), got {self.algorithm!r}; "
                    "use kl_loss_coef"
                )
            if self.critic_warmup_steps > 0:
                raise ValueError(
                    f"critic_warmup_steps needs algorithm='ppo', got {self.algorithm!r}"
                )
        for name, optim in (("actor", self.actor), ("critic", self.critic)):
            if optim.lr_warmup_steps > self.total_steps:
                raise ValueError(
                    f"{name}.lr_warmup_steps ({optim.lr_warmup_steps}) exceeds total_steps "
                    f"({self.total_steps})"
                )
        return self

    @property
    def uses_critic(self) -> bool:
        return self.algorithm == "ppo"

    @property
    def uses_reference(self) -> bool:
        return self.kl_loss_coef > 0 or self.kl_reward_coef > 0
