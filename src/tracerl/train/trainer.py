"""The trainer: one `step(samples) -> metrics` of PPO (critic, GAE) or a group baseline, plus
checkpoints and weight export. The RL loop drives it; it never talks HTTP.

    trainer = Trainer(TrainerConfig(model="tiny", algorithm="ppo"))
    metrics = trainer.step([TrainSample(token_ids, loss_mask, logprobs, reward, group_id, v)])
    trainer.save_checkpoint(run_dir / "checkpoints", loop_state={"data_position": 7})
    loop_state = trainer.load_checkpoint(run_dir / "checkpoints")   # the newest one
    trainer.export(run_dir / "export")        # Hugging Face dir for engines; critic/ inside
    await pool.update_weights(None, version, trainer.actor_named_tensors())  # in process

A PPO step: reference log-probs (KL configured) -> behaviour log-probs (KL-in-reward with
`recompute`) -> critic values under no_grad -> token rewards (terminal score, minus
beta * KL) -> GAE -> critic updates -> actor updates (PPO-clip with TIS against the rollout
log-probs). During `critic_warmup_steps` it stops after the critic: no actor forward, update or
schedule step, and KL-in-reward uses the rollout log-probs. A group-baseline step takes
`group_advantages` for every action token of a trajectory and updates the actor (optionally
with the KL loss). It trains on every sample it is given: dropping uniform-reward groups
(`filter_uniform_groups`) is the loop's, before a step, so that the step can wait for signal.
Uniform groups it is given are counted; a sample whose advantage is 0 (without a KL loss) counts
in the loss denominators but is never forwarded, since its gradient is exactly zero, and a batch
with no signal still steps the optimizer (AdamW's momentum), as training on it would. Phases
go through `MemoryPhases`, which on CUDA moves the models not in use to the host.

Under a torch process group of several ranks (`tracerl.train.shard`), the models are sharded
with FSDP2 and each rank is given the same whole batch and trains on its share; the step is the
one-process step up to float rounding, and checkpoints (DCP) move between rank counts.

Models run in eval mode (no dropout), so the first update's ratio is exactly 1. When the actor
makes one update per step its old log-probs are that update's own forward (detached); with
more, they come from a no-grad pass first. Metrics are `dict[str, float]`, grouped by prefix:
`actor/`, `critic/`, `adv/`, `reward/`, `mismatch/` (train vs rollout log-probs), `kl/`,
`groups/`, `time/` (seconds per phase), `perf/`.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import torch

from tracerl.algo.advantages import gae, group_advantages, uniform_groups, whiten
from tracerl.algo.distributed import all_reduce_sum
from tracerl.config.train import RESUME_SAFE_FIELDS, OptimizerConfig, TrainerConfig
from tracerl.engine.adapters import AdapterWeights
from tracerl.models import sliding_window
from tracerl.train import checkpoint as ckpt
from tracerl.train import lora, probe
from tracerl.train.batch import (
    MicroBatch,
    PackedBatch,
    SampleError,
    TrainSample,
    micro_batches_for,
    resolve_batching,
)
from tracerl.train.forward import AUTOCAST, all_logprobs, all_values
from tracerl.train.models import load_actor, load_reference, value_model_from_actor
from tracerl.train.phases import MemoryPhases, Phase, Place
from tracerl.train.replay import check_replayable
from tracerl.train.schedule import ResumableLambdaLR, build_lr_schedule
from tracerl.train.shard import Shard, reshard, shard_model, world
from tracerl.train.update import (
    ActorTargets,
    Metrics,
    critic_metrics,
    ppo_rewards,
    token_stats,
    update_actor,
    update_critic,
    update_sft,
    value_and_update_critic,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def default_device() -> torch.device:
    """CUDA when present (a rank's own device under a process group), else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


class Trainer:
    """Actor, critic (ppo), reference (a KL coefficient set), their optimizers and schedules.

    `device` defaults to CUDA when present. Construction seeds torch's and Python's global
    generators with `config.seed`; checkpoints save and restore them.
    """

    def __init__(self, config: TrainerConfig, device: str | torch.device | None = None) -> None:
        self.config = config
        self.rank, self.world_size = world()
        self.device = torch.device(device if device is not None else default_device())
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        dtype = DTYPES[config.dtype]
        self.autocast = AUTOCAST[config.autocast]
        self.actor, self.tokenizer, self.model_path = load_actor(
            config.model, dtype=dtype, chat_template=config.chat_template
        )
        self.actor.eval()
        self.critic = (
            value_model_from_actor(self.actor, seed=config.seed).to(dtype).eval()
            if config.uses_critic
            else None
        )
        self.lora = config.lora
        if self.lora is not None:
            lora.adapt(self.actor, self.critic, self.lora, self.world_size)
        # with LoRA the reference is the actor with its adapters off
        self.reference = (
            load_reference(self.model_path, dtype=dtype)
            if config.uses_reference and self.lora is None
            else None
        )
        # routing replay where the model has routers (refused for routers it cannot replay)
        self.replay = config.moe.routing == "replay" and check_replayable(self.actor) > 0
        self.batching = resolve_batching(config.batching, self.actor)
        # PPO values the states in the critic update's own forward where that gives the same
        # values (`_values_in_update`); False always runs the separate no-grad pass (the
        # tests compare the two)
        self.fuse_value_pass = True
        # a tree row's mask replaces the model's own, which would drop a sliding window
        self.share_prefix = config.share_prefix and sliding_window(self.actor.config) is None
        # FSDP2 keeps the models resident and shards them instead of moving them whole.
        offload = self.device.type == "cuda" and config.offload_models and self.world_size == 1
        self.phases = MemoryPhases(self._transfer if offload else None)
        if not offload:
            for model in self._models().values():
                model.to(self.device)
        if self.world_size > 1:  # the optimizers must see the sharded parameters
            for model in self._models().values():
                shard_model(model)
        self.actor_optimizer, self.actor_scheduler = self._optimizer(self.actor, config.actor)
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self.critic_scheduler: ResumableLambdaLR | None = None
        if self.critic is not None:
            self.critic_optimizer, self.critic_scheduler = self._optimizer(
                self.critic, config.critic
            )
        self.step_count = 0

    # ---- models ---------------------------------------------------------------------------

    def _models(self, trained_only: bool = False) -> dict[str, torch.nn.Module]:
        """The actor, the critic and the reference model that exist; `trained_only`: the ones
        a checkpoint holds (the reference is the frozen initial actor)."""
        models: dict[str, torch.nn.Module] = {"actor": self.actor}
        if self.critic is not None:
            models["critic"] = self.critic
        if self.reference is not None and not trained_only:
            models["reference"] = self.reference
        return models

    def _optimizer(
        self, model: torch.nn.Module, optim: OptimizerConfig
    ) -> tuple[torch.optim.Optimizer, ResumableLambdaLR]:
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=optim.lr,
            betas=(optim.beta1, optim.beta2),
            eps=optim.eps,
            weight_decay=optim.weight_decay,
            fused=True,  # one kernel over all parameters: ~6x faster than the loop on a CPU
        )
        # The schedule advances once per applied update; its unit in the config is a step.
        updates = optim.epochs * optim.mini_batches
        schedule = build_lr_schedule(
            optimizer,
            warmup_steps=optim.lr_warmup_steps * updates,
            total_steps=self.config.total_steps * updates,
            kind=optim.schedule,
            min_lr_ratio=optim.min_lr_ratio,
        )
        return optimizer, schedule

    def _transfer(self, name: str, place: Place) -> None:
        """Move a model, and its optimizer state, to the accelerator or the host."""
        target = self.device if place == "device" else torch.device("cpu")
        self._models()[name].to(target)
        optimizer = {"actor": self.actor_optimizer, "critic": self.critic_optimizer}.get(name)
        if optimizer is not None:
            for state in optimizer.state.values():
                for key, value in state.items():  # `step` too: fused AdamW reads it there
                    if isinstance(value, torch.Tensor):
                        state[key] = value.to(target, non_blocking=True)

    def actor_named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The actor's parameters by name (detached, not copied), for an in-process engine
        weight push (`LocalEngine.update_weights` / `EnginePool.update_weights`). Sharded:
        every rank must call; rank 0 gets the gathered full tensors, the others none."""
        if self.world_size > 1:
            return list(self._full_states(actor_only=True)["actor"].items())
        if self.lora is not None:
            return lora.merged_named_tensors(self.actor)
        return [(n, p.detach()) for n, p in self.actor.named_parameters(remove_duplicate=False)]

    def adapter_weights(self) -> AdapterWeights | None:
        """With LoRA, the actor's adapters alone for an in-process engine push (the engines
        apply them over their base); None when the full weights train."""
        return lora.adapter_weights(self.actor) if self.lora is not None else None

    def write_adapter(self, path: Path) -> Path:
        """With LoRA, the actor's adapter in peft's layout at `path` (replaced atomically), for
        engine servers that load adapters; the path."""
        assert self.lora is not None, "write_adapter needs trainer.lora"
        return lora.write_adapter_atomically(path, self.actor, self.config.model)

    def probe_logprobs(self, token_ids: Sequence[int], prompt_len: int) -> list[float]:
        """The actor's log-probs of `token_ids[prompt_len:]` (the weight probe after a push,
        `tracerl.run.probe`). Sharded: every rank calls and gets them."""
        self.phases.require_idle("probe")
        self.phases.enter(Phase.BEHAVIOUR)  # the actor on the device (offloading)
        try:
            return probe.sequence_logprobs(
                self.actor, token_ids, prompt_len, self.config.temperature
            )
        finally:
            self.phases.enter(Phase.IDLE)

    def probe_suspects(
        self, token_ids: Sequence[int], prompt_len: int, engine_logprobs: Sequence[float]
    ) -> list[str]:
        """The layers that explain an engine's different log-probs of the probe, if it kept
        their initial weights (`tracerl.train.probe.suspects`); not diagnosed (empty) on a
        sharded trainer."""
        if self.world_size > 1:
            return []
        self.phases.enter(Phase.BEHAVIOUR)
        try:
            return probe.suspects(
                self.actor, token_ids, prompt_len, self.config.temperature,
                engine_logprobs, self.model_path,
            )  # fmt: skip
        finally:
            self.phases.enter(Phase.IDLE)

    def _full_states(self, actor_only: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """The trained models' full state dicts, gathered from their shards onto rank 0's host
        memory (a collective: every rank calls; the others get empty dicts)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        models = {"actor": self.actor} if actor_only else self._models(trained_only=True)
        return {
            name: cast(dict[str, torch.Tensor], get_model_state_dict(m, options=options))
            for name, m in models.items()
        }

    # ---- a step ---------------------------------------------------------------------------

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """Train on one batch of trajectories; return the step's metrics. Under a process
        group every rank is given the same whole batch and trains on its shard of it."""
        started = time.perf_counter()
        shard, batch = self._batch(samples)
        metrics = Metrics()
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.step_count)
        try:
            if self.config.uses_critic:
                uniform = len({s.reward for s in samples}) == 1  # the whole batch's rewards
                trained = self._ppo_step(batch, shard, metrics, generator, uniform)
            else:
                trained = self._group_step(batch, shard, samples, metrics, generator)
        finally:
            self.phases.enter(Phase.IDLE)
        self.step_count += 1
        elapsed = time.perf_counter() - started
        trained_tokens = float(sum(batch.lengths[i] for i in trained))
        tokens = float(all_reduce_sum(torch.tensor(trained_tokens, dtype=torch.float64)))
        versions = [s.weight_version for s in samples]
        metrics.set("time/step", elapsed)
        metrics.set("perf/tokens", tokens)
        metrics.set("perf/tokens_per_s", tokens / elapsed)
        metrics.set("perf/trainer_ranks", float(self.world_size))
        metrics.set("step", float(self.step_count))
        metrics.set("weight_version/min", float(min(versions)))
        metrics.set("weight_version/max", float(max(versions)))
        if self.replay:  # positions whose routing was replayed (the rest routed by the model)
            replayed = 0 if batch.routing is None else int((batch.routing[:, 0, 0] >= 0).sum())
            metrics.set("moe/replayed_fraction", replayed / max(int(batch.token_ids.numel()), 1))
        metrics.mean("reward/mean", float(batch.rewards.sum()) / max(batch.size, 1), batch.size)
        return metrics.result()

    def _batch(self, samples: Sequence[TrainSample]) -> tuple[Shard, PackedBatch]:
        """This rank's share of a step's samples, packed on the device."""
        if not samples:
            raise SampleError("samples: a step needs at least one sample")
        shard = Shard.split(samples, self.rank, self.world_size)
        owned = [samples[i] for i in shard.owned]
        return shard, PackedBatch.build(owned, self.device, routing=self.replay)

    def sft_step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One supervised step on `samples`: the mean negative log-likelihood of their
        `loss_mask` tokens (rewards and log-probs unused), one optimizer update."""
        started = time.perf_counter()
        shard, batch = self._batch(samples)
        metrics = Metrics()
        try:
            with self._phase(Phase.ACTOR, "actor", metrics):
                self.phases.require("actor")
                with self._adapter_dropout(self.actor):
                    update_sft(
                        self.actor, self.actor_optimizer, self.actor_scheduler, batch, shard,
                        self.config, metrics, self.batching,
                    )  # fmt: skip
        finally:
            self.phases.enter(Phase.IDLE)
        self.step_count += 1
        elapsed = time.perf_counter() - started
        mask_tokens = float(all_reduce_sum(batch.loss_mask.sum().double().cpu()))
        tokens = float(all_reduce_sum(torch.tensor(float(sum(batch.lengths)), dtype=torch.float64)))
        metrics.set("time/step", elapsed)
        metrics.set("perf/tokens", tokens)
        metrics.set("perf/trained_tokens", mask_tokens)
        metrics.set("perf/tokens_per_s", tokens / elapsed)
        metrics.set("step", float(self.step_count))
        return metrics.result()

    @contextlib.contextmanager
    def _phase(self, phase: Phase, name: str, metrics: Metrics) -> Iterator[None]:
        started = time.perf_counter()
        self.phases.enter(phase)
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        metrics.set(f"time/{name}", time.perf_counter() - started)

    def _adapter_dropout(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """LoRA's dropout, in an update's forwards only."""
        if self.lora is None or self.lora.dropout == 0:
            return contextlib.nullcontext()
        return lora.dropout_active(model)

    def _values_in_update(self) -> bool:
        """Whether the critic's update forward also gives the step's values (one update, and
        no LoRA dropout, whose values would differ from a no-grad pass's), instead of a
        separate no-grad value pass before it."""
        one_update = self.config.critic.epochs == 1 and self.config.critic.mini_batches == 1
        dropout = self.lora is not None and self.lora.dropout > 0
        return self.fuse_value_pass and one_update and not dropout

    def _mbs(self, batch: PackedBatch, samples: Sequence[int]) -> list[MicroBatch]:
        return micro_batches_for(batch, samples, self.config, self.batching, self.share_prefix)

    def _reference_logprobs(
        self, batch: PackedBatch, shard: Shard, mbs: list[MicroBatch], metrics: Metrics
    ) -> torch.Tensor | None:
        if not self.config.uses_reference:
            return None
        if self.reference is None:  # LoRA: the actor without its adapters
            with (
                self._phase(Phase.BEHAVIOUR, "reference", metrics),
                lora.adapters_disabled(self.actor),
            ):
                self.phases.require("actor")
                return all_logprobs(
                    self.actor, mbs, batch.token_ids.numel(), self.config.temperature,
                    self.device, shard.padding(mbs, self.device, self.batching), self.autocast,
                )  # fmt: skip
        with self._phase(Phase.REFERENCE, "reference", metrics):
            self.phases.require("reference")
            out = all_logprobs(
                self.reference, mbs, batch.token_ids.numel(), self.config.temperature,
                self.device, shard.padding(mbs, self.device, self.batching), self.autocast,
            )  # fmt: skip
            reshard(self.reference)
            return out

    def _behaviour_logprobs(
        self, batch: PackedBatch, shard: Shard, mbs: list[MicroBatch], metrics: Metrics
    ) -> torch.Tensor:
        with self._phase(Phase.BEHAVIOUR, "behaviour", metrics):
            self.phases.require("actor")
            out = all_logprobs(
                self.actor, mbs, batch.token_ids.numel(), self.config.temperature,
                self.device, shard.padding(mbs, self.device, self.batching), self.autocast,
            )  # fmt: skip
            reshard(self.actor)
            return out

    def _ppo_step(
        self,
        batch: PackedBatch,
        shard: Shard,
        metrics: Metrics,
        generator: torch.Generator,
        uniform_rewards: bool,
    ) -> list[int]:
        """One PPO step; `uniform_rewards`: every episode of the whole batch has the same
        reward (its advantages are whitened only with `whiten_uniform_batches`, and are 0
        with `zero_uniform_batches`)."""
        cfg = self.config
        assert self.critic is not None and self.critic_optimizer is not None
        samples = list(range(batch.size))
        mbs = self._mbs(batch, samples)
        mask, cu = batch.loss_mask, batch.cu_seqlens
        warmup = self.step_count < cfg.critic_warmup_steps
        ref = self._reference_logprobs(batch, shard, mbs, metrics)
        old: torch.Tensor | None = None
        # One no-grad actor pass, before the critic phase, serves KL-in-reward and the old
        # log-probs of several actor updates.
        recompute = cfg.kl_reward_coef > 0 and cfg.kl_behavior_logprobs == "recompute"
        # the same on every rank: the whole batch's rewards and the config decide it
        zeroed = uniform_rewards and cfg.zero_uniform_batches and cfg.kl_reward_coef == 0
        forwarded = not zeroed or cfg.kl_loss_coef > 0  # a KL loss has a gradient of its own
        if not warmup and forwarded and (recompute or self._actor_updates(shard.total) > 1):
            old = self._behaviour_logprobs(batch, shard, mbs, metrics)
        # KL-in-reward's behaviour log-probs: recomputed unless configured otherwise; critic
        # warmup has no actor pass
        behaviour = old if recompute and old is not None else batch.rollout_logprobs
        rewards = ppo_rewards(batch, cfg, behaviour, ref, metrics)

        def estimate(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return gae(values, rewards, mask, cu, cfg.gamma, cfg.lam)  # advantages, returns

        with self._phase(Phase.CRITIC, "critic", metrics):
            self.phases.require("critic")
            if self._values_in_update():
                values = value_and_update_critic(
                    self.critic, self.critic_optimizer, self.critic_scheduler, batch, shard,
                    lambda v: estimate(v)[1], cfg, generator, metrics, self.batching,
                )  # fmt: skip
                advantages, returns = estimate(values)
            else:
                values = all_values(
                    self.critic, mbs, batch.token_ids.numel(), self.device,
                    shard.padding(mbs, self.device, self.batching), self.autocast,
                )  # fmt: skip
                reshard(self.critic)
                advantages, returns = estimate(values)
                with self._adapter_dropout(self.critic):
                    update_critic(
                        self.critic, self.critic_optimizer, self.critic_scheduler, batch,
                        shard, values, returns, cfg, generator, metrics, self.batching,
                    )  # fmt: skip
            critic_metrics(values, returns, mask, metrics)
        if warmup:
            metrics.set("critic/warmup", 1.0)
            return samples
        metrics.set("adv/zeroed", float(zeroed))
        if zeroed:  # the update on advantage 0: the optimizer's step on a zero gradient
            advantages = torch.zeros_like(advantages)
            no_grad = frozenset() if forwarded else frozenset(samples)
            self._train_actor(
                batch, shard, forwarded, mbs, advantages, old, ref, metrics, generator, no_grad
            )
            return samples
        whitened = cfg.whiten_advantages and (cfg.whiten_uniform_batches or not uniform_rewards)
        if whitened:
            advantages = whiten(advantages, mask)
        metrics.set("adv/whitened", float(whitened))
        for key, value in token_stats(advantages, mask).items():
            metrics.set(f"adv/{key}", value)
        self._train_actor(batch, shard, True, mbs, advantages, old, ref, metrics, generator)
        return samples

    def _group_step(
        self,
        batch: PackedBatch,
        shard: Shard,
        whole: Sequence[TrainSample],
        metrics: Metrics,
        generator: torch.Generator,
    ) -> list[int]:
        """Baselines come from the whole batch (`whole`), which every rank holds; each rank
        trains on its shard of it."""
        cfg = self.config
        rewards = torch.tensor([s.reward for s in whole], dtype=torch.float32)
        group_ids = torch.tensor([s.group_id for s in whole], dtype=torch.int64)
        uniform = uniform_groups(rewards, group_ids)
        metrics.set("groups/count", float(torch.unique(group_ids).numel()))
        metrics.set("groups/uniform", float(torch.unique(group_ids[uniform]).numel()))
        method = cfg.algorithm
        assert method != "ppo"  # a group baseline, narrowed for the type checker
        whole_advantages = group_advantages(
            rewards, group_ids, method, std_normalize=cfg.std_normalize
        ).tolist()
        # Without a KL loss, a sample whose advantage is 0 has exactly zero gradient: it stays
        # in the denominators (so the update equals training on it) but is never forwarded.
        zero = [cfg.kl_loss_coef == 0 and a == 0.0 for a in whole_advantages]
        metrics.set("actor/zero_grad_samples", float(sum(zero)))
        per_sample = torch.tensor(
            [whole_advantages[g] for g in shard.owned], dtype=torch.float32, device=self.device
        )
        lengths = torch.tensor(batch.lengths, device=self.device)
        advantages = torch.repeat_interleave(per_sample, lengths) * batch.loss_mask
        zero_grad = frozenset(i for i, g in enumerate(shard.owned) if zero[g])
        computed = [i for i in range(batch.size) if i not in zero_grad]
        for key, value in token_stats(advantages, batch.loss_mask).items():
            metrics.set(f"adv/{key}", value)
        mbs = self._mbs(batch, computed) if computed else []
        ref = self._reference_logprobs(batch, shard, mbs, metrics)
        self._train_actor(
            batch, shard, not all(zero), mbs, advantages, None, ref, metrics, generator, zero_grad
        )
        return computed

    def _actor_updates(self, samples: int) -> int:
        optim = self.config.actor
        return optim.epochs * min(optim.mini_batches, samples)

    def _train_actor(
        self,
        batch: PackedBatch,
        shard: Shard,
        forwarded: bool,
        mbs: list[MicroBatch],
        advantages: torch.Tensor,
        old: torch.Tensor | None,
        ref: torch.Tensor | None,
        metrics: Metrics,
        generator: torch.Generator,
        zero_grad: frozenset[int] = frozenset(),
    ) -> None:
        """`forwarded`: some rank forwards a sample (not all are zero-gradient), decided from
        the whole batch so that every rank makes the same passes."""
        if old is None and forwarded and self._actor_updates(shard.total) > 1:
            old = self._behaviour_logprobs(batch, shard, mbs, metrics)
        with self._phase(Phase.ACTOR, "actor", metrics):
            self.phases.require("actor")
            with self._adapter_dropout(self.actor):
                update_actor(
                    self.actor, self.actor_optimizer, self.actor_scheduler, batch, shard,
                    ActorTargets(advantages, old, ref if self.config.kl_loss_coef > 0 else None),
                    self.config, generator, metrics, self.batching, zero_grad,
                )  # fmt: skip

    # ---- checkpoints and export -------------------------------------------------------------

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        out = {"actor": self.actor_optimizer}
        if self.critic_optimizer is not None:
            out["critic"] = self.critic_optimizer
        return out

    def save_checkpoint(
        self, directory: str | Path, loop_state: bytes | dict[str, Any] | None = None
    ) -> Path:
        """Save everything a resume needs under `directory/step_<step>` (atomically), keep the
        newest `keep_last_n`; `loop_state` (bytes, or a JSON-able dict) comes back from
        `load_checkpoint` as it was given. Returns the checkpoint's path. Sharded: every rank
        calls (each writes its shards), into a directory they all see."""
        self.phases.require_idle("save_checkpoint")
        return ckpt.write_checkpoint(
            directory,
            self.step_count,
            self.config.model_dump(mode="json"),
            self._models(trained_only=True),
            self._optimizers(),
            ckpt.training_state(self.step_count, self.actor_scheduler, self.critic_scheduler),
            loop_state,
            self.config.keep_last_n,
        )

    def load_checkpoint(self, path: str | Path) -> bytes | dict[str, Any] | None:
        """Restore a checkpoint: `path` is one (`.../step_00000042`) or a directory of them
        (the newest is taken), saved on any number of ranks. Returns the loop state it was
        saved with."""
        self.phases.require_idle("load_checkpoint")
        root = Path(path)
        if not root.exists():
            raise ckpt.CheckpointError(f"{root} does not exist")
        if not root.name.startswith(ckpt.PREFIX):  # a directory of checkpoints
            latest = ckpt.latest_checkpoint(root)
            if latest is None:
                raise ckpt.CheckpointError(f"{root}: holds no complete checkpoint")
            root = latest
        step, state, loop_state = ckpt.read_checkpoint(
            root,
            self.config.model_dump(mode="json"),
            self._models(trained_only=True),
            self._optimizers(),
            RESUME_SAFE_FIELDS,
        )
        ckpt.restore_training_state(state, self.actor_scheduler, self.critic_scheduler)
        self.step_count = step
        return loop_state

    def export(self, path: str | Path) -> Path:
        """Write the actor as a Hugging Face directory (safetensors, config, tokenizer) that
        engines load, and the critic under `critic/`; atomically replaces `path`. With LoRA the
        weights are merged (base + adapters). Sharded: every rank calls (the weights are
        gathered), rank 0 writes."""
        self.phases.require_idle("export")
        if self.lora is not None:  # the merged weights, under the base model's names
            merged = {"actor": dict(lora.merged_named_tensors(self.actor))}
            if self.critic is not None:
                merged["critic"] = dict(lora.merged_named_tensors(self.critic))
            return ckpt.export_hf(Path(path), self.actor, self.tokenizer, self.critic, merged)
        if self.world_size == 1:
            return ckpt.export_hf(Path(path), self.actor, self.tokenizer, self.critic)
        states = self._full_states()
        return Path(
            ckpt.on_rank_zero(
                lambda: str(
                    ckpt.export_hf(Path(path), self.actor, self.tokenizer, self.critic, states)
                )
            )
        )
