"""The trainer: one `step(samples) -> metrics` of PPO (critic, GAE) or a group baseline, plus
checkpoints and weight export. The RL loop drives it; it never talks HTTP.

    trainer = Trainer(TrainerConfig(model="tiny", algorithm="ppo"))
    metrics = trainer.step([TrainSample(token_ids, loss_mask, logprobs, reward, group_id, v)])
    trainer.save_checkpoint(run_dir / "checkpoints", loop_state={"data_position": 7})
    loop_state = trainer.load_checkpoint(run_dir / "checkpoints")   # the newest one
    trainer.export(run_dir / "export")        # Hugging Face dir for engines; critic/ inside
    await pool.update_weights(None, version, trainer.actor_named_tensors())  # in process

The step's algorithm (PPO or a group baseline) and its passes are `tracerl.train.steps`'s; the
trainer owns the models, optimizers, schedules, checkpoints and export. Phases go through
`MemoryPhases`, which on CUDA moves the models not in use to the host.

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

from tracerl.algo.distributed import all_reduce_sum
from tracerl.config.train import RESUME_SAFE_FIELDS, OptimizerConfig, TrainerConfig
from tracerl.engine.adapters import AdapterWeights
from tracerl.models import sliding_window
from tracerl.train import checkpoint as ckpt
from tracerl.train import lora, probe, steps
from tracerl.train.batch import (
    MicroBatch,
    PackedBatch,
    SampleError,
    TrainSample,
    micro_batches_for,
    resolve_batching,
)
from tracerl.train.forward import AUTOCAST
from tracerl.train.models import load_actor, load_reference, value_model_from_actor
from tracerl.train.phases import MemoryPhases, Phase, Place
from tracerl.train.replay import check_replayable
from tracerl.train.schedule import ResumableLambdaLR, build_lr_schedule
from tracerl.train.shard import Shard, shard_model, world
from tracerl.train.update import Metrics, update_sft

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
        # values (`steps.values_in_update`); False always runs the separate no-grad pass (the
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
                trained = steps.ppo_step(self, batch, shard, metrics, generator, uniform)
            else:
                trained = steps.group_step(self, batch, shard, samples, metrics, generator)
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
            with self.phase(Phase.ACTOR, "actor", metrics):
                self.phases.require("actor")
                with self.adapter_dropout(self.actor):
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

    # ---- what a step's passes share (`tracerl.train.steps`) -----------------------------------

    @contextlib.contextmanager
    def phase(self, phase: Phase, name: str, metrics: Metrics) -> Iterator[None]:
        """Enter a memory phase (`MemoryPhases`) and time it as `time/NAME`."""
        started = time.perf_counter()
        self.phases.enter(phase)
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        metrics.set(f"time/{name}", time.perf_counter() - started)

    def adapter_dropout(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """LoRA's dropout, in an update's forwards only."""
        if self.lora is None or self.lora.dropout == 0:
            return contextlib.nullcontext()
        return lora.dropout_active(model)

    def micro_batches(self, batch: PackedBatch, samples: Sequence[int]) -> list[MicroBatch]:
        """The micro-batches of `samples` (indices into `batch`) under this trainer's batching."""
        return micro_batches_for(batch, samples, self.config, self.batching, self.share_prefix)

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
