"""The RL loop: everything `tracerl train` runs, in one process on one machine.

Start-up (`startup.py`): the trainer (actor, critic or reference as configured) and, on
`--resume`, its newest checkpoint with the loop's state; the embedded engine behind an
`EnginePool` (given the trainer's weights when resuming); the gateway on 127.0.0.1 writing
`RUN_DIR/traces.sqlite` (on Ray, possibly gateways and agent workers as actors:
`gateways.py`); the environment, the dataset (at its saved position), the dispatcher with the
adaptive concurrency controller and the metrics collector.

Rollouts: a feeder draws tasks and submits `group_size` episodes per task to the dispatcher, as
long as fewer than `groups_per_step x (1 + max_off_policy_steps)` groups are outstanding (in
flight or ready), so rollouts for the next steps run while a step trains. Each episode is a
gateway session played by the environment (`tracerl.run.rollouts`).

A step: take `batch_size / group_size` ready groups whose samples are at most
`max_off_policy_steps` weight versions old (older ones are dropped and counted; the trainer's TIS
corrects what remains), train on them in a worker thread (the event loop keeps serving the
gateway and the engine), push the new weights to the engines through the pool (version = step),
checkpoint, then log. Synchronous mode (`max_off_policy_steps = 0`) stops admissions and sheds
what is in flight while a step trains, so every trajectory comes from the current weights.
Embedded engines sharing the CPU with the trainer are paused in place while it trains and take
the new weights before they resume (`loop.engines_while_training`).

Evals (`[eval]`, greedy by default; `tracerl.run.evals`) run on exactly one weight version:
while one is in flight no training episode is admitted and no newer weights are pushed; the
controller never sheds eval episodes. `loop.max_minutes` ends the run at a wall-clock budget
from process start, with a final eval. `RUN_DIR/groups.jsonl` says, per group, which step
trained on it or why none did.

Checkpoints are written before a step's metrics line, so a logged step always has one; a
`kill -9` loses at most the step in progress (a resumed run drops any later lines from
`metrics.jsonl`), and never a committed trace. Ctrl-C (SIGINT/SIGTERM) stops admissions, cancels
the episodes in flight, checkpoints the last finished step, and closes engines and the store.

This module holds the feeder, the steps and shutdown, which share one state (events, counters,
the group buffer); `RLLoop` is a `LoopStartup` (`startup.py`), which builds the parts they run.
The episodes' side is in `rollouts.py`, evals in `evals.py`, the trainer, engines and gateways
it starts in `trainers.py`, `engines.py` and `gateways.py`, its spans (`[telemetry]`) in
`spans.py`, and the episode records (`episodes.jsonl`, `episodes_failed.jsonl`) in
`episode_log.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracerl.config.run import TrainCommandConfig
from tracerl.control.controller import Kind
from tracerl.control.dispatcher import DispatcherClosed, Episode, Finished
from tracerl.envs import EpisodeResult
from tracerl.eventloop import close_all
from tracerl.run import engines, probe
from tracerl.run.metrics import (
    optimizer_memory,
    process_elapsed_s,
    process_memory,
    release_free_memory,
    run_until,
)
from tracerl.run.rollouts import (
    Group,
    Play,
    Rollout,
    dispatch_gauges,
    episode_seed,
    rollout_metrics,
)
from tracerl.run.spans import record_step
from tracerl.run.startup import LoopStartup
from tracerl.trace.versions import oldest_trainable
from tracerl.train.export import snapshot_path

if TYPE_CHECKING:  # torch and the servers load in _start, after the config is checked
    from tracerl.train.batch import TrainSample

log = logging.getLogger(__name__)

# A step waiting while this many steps' worth of groups came back uniform gets a warning.
UNIFORM_WARNING_STEPS = 4


class RLLoop(LoopStartup):
    def __init__(
        self,
        config: TrainCommandConfig,
        run_dir: Path,
        resume: bool = False,
        engines: dict[str, Any] | None = None,
    ) -> None:
        """`engines`: in-process engine objects to use instead of the embedded one (the
        benchmarks pass simulated engines); each must take weights in process
        (`update_weights(named_tensors, version)`)."""
        self.config = config
        self._given_engines = engines
        self.run_dir = run_dir
        self.resume = resume
        orch = config.orchestrator
        self.groups_per_step = orch.batch_size // orch.group_size
        self.step = 0
        self._stop = asyncio.Event()
        self._room = asyncio.Event()  # a group may be submitted
        self._ready = asyncio.Event()  # a group became ready
        self._gate = asyncio.Event()  # admissions open (closed while a sync step trains)
        self._gate.set()
        self._tokens = 0
        self._admitted: dict[str, int] = {}  # in-flight train episode -> step it was admitted at
        self._training = False
        self.closers: list[Any] = []

    # ------------------------------------------------------------------ episodes

    async def _run_episode(self, episode: Episode) -> tuple[Rollout, int]:
        play: Play = episode.payload
        rollout = await self.runner.run(play.task, episode.group, episode.kind, play.sampling)
        return rollout, rollout.held_tokens  # the episode's cost to the controller

    def _on_complete(self, result: Finished) -> None:
        ep = result.episode
        self._admitted.pop(ep.episode_id, None)
        group = ep.group
        kind: Kind = "eval" if ep.kind == "eval" else "train"
        self.controller.on_episode_complete(
            ep.env, kind, result.tokens, result.duration_s, asyncio.get_running_loop().time()
        )
        if result.cancelled:
            if kind == "eval":  # the loop stopping: the eval still ends, with a record
                failed = EpisodeResult(None, failed=True, reason="cancelled")
                self.evals.record(group, Rollout(group, kind, failed))
                return
            self.buffer.cancel(group)
            self._room.set()
            return
        if result.error is not None:  # the runner itself failed (gateway, store): a record
            log.warning("episode %s failed: %r", ep.episode_id, result.error)
            reason = f"{type(result.error).__name__}: {result.error}"
            rollout = Rollout(group, kind, EpisodeResult(None, failed=True, reason=reason))
        else:
            rollout = result.value
        self._tokens += rollout.tokens
        self.episode_log.record(rollout, ep.episode_id, self.step, ep.env)
        if kind == "eval":
            self.evals.record(group, rollout)
            return
        before = len(self.buffer.ready)
        self.buffer.add(rollout)
        if len(self.buffer.ready) > before:
            self._ready.set()
        self._room.set()

    def _record_group(self, group: Group, outcome: str, step: int | None = None) -> None:
        """One line per ended group in RUN_DIR/groups.jsonl: the step that trained on it, or
        why it never reached one (uniform rewards, too few successful episodes, stale)."""
        rewards = [r.result.reward for r in group.rollouts]
        self.dataset.observe(group.group, rewards)  # difficulty-aware drawing
        record = {"group": group.group, "outcome": outcome, "step": step, "rewards": rewards}
        record["oldest_version"] = group.version if group.rollouts else None
        with (self.run_dir / "groups.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")

    def _outstanding(self) -> int:
        return len(self.buffer.pending) + len(self.buffer.ready)

    async def _feed(self) -> None:
        c = self.config
        if not c.loop.steps:  # an eval-only run plays no training episode
            return
        ahead = self.groups_per_step * (1 + c.loop.max_off_policy_steps)
        while not self._stop.is_set():
            await self._gate.wait()
            await self.evals.idle.wait()  # an eval has the engines to itself, and ends sooner
            if self._outstanding() >= ahead:
                self._room.clear()
                await self._room.wait()
                continue
            group = self._group_counter
            item = self.dataset.next(group)
            self._group_counter += 1
            for k in range(c.orchestrator.group_size):
                if k and self.buffer.cancelled(group):  # shed while it was being submitted
                    self.buffer.never_submitted(group, c.orchestrator.group_size - k)
                    break  # its remaining members would run for nothing
                seed = episode_seed(c.loop.seed, group, k)
                episode = Episode(
                    f"g{group}-{k}",
                    group,
                    env=self.env.name,
                    kind="train",
                    payload=Play(item.task, {"seed": seed}),
                )
                try:
                    await self.dispatcher.submit(episode)
                except DispatcherClosed:
                    return
                self._admitted[episode.episode_id] = self.step  # the weights it starts on
                if k == 0:  # counted as outstanding from its first episode on
                    self.buffer.open(group)

    # ------------------------------------------------------------------ steps

    async def _step(self) -> dict[str, Any] | None:
        """One training step's record, or None where the run stopped while the step waited
        for rollouts (then nothing was taken from the buffer)."""
        c = self.config
        step = self.step + 1
        min_version = oldest_trainable(step, c.loop.max_off_policy_steps)
        waited = time.monotonic()
        if self.buffer.drop_stale(min_version):
            self._room.set()  # their places go to fresh groups
        uniform_before, warned = self.buffer.counters["groups_uniform"], False
        while self.buffer.fresh_ready(min_version) < self.groups_per_step:
            self._ready.clear()
            if self._stop.is_set():
                return None
            uniform = self.buffer.counters["groups_uniform"] - uniform_before
            if not warned and uniform >= UNIFORM_WARNING_STEPS * self.groups_per_step:
                warned = True
                log.warning(
                    "step %d: %d groups in a row had equal rewards (dropped: no signal for a "
                    "group baseline); the task may be too hard or too easy for the model: "
                    "consider an easier dataset, reward shaping, or algorithm='ppo'",
                    step,
                    uniform,
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._ready.wait()
        wait_s = time.monotonic() - waited
        groups = self.buffer.take(self.groups_per_step, min_version)
        for group in groups:
            self._record_group(group, "trained", step)
        if c.loop.max_off_policy_steps == 0:  # synchronous: nothing runs on old weights
            self._gate.clear()
            self.dispatcher.shed(self.dispatcher.inflight, kind="train")
        samples = [s for g in groups for r in g.rollouts for s in r.samples]
        rollouts = [r for g in groups for r in g.rollouts]
        started = time.monotonic()
        self._training = True  # from here the step completes even if a stop is asked
        pause = self._pause_engines_while_training()
        try:
            if pause:  # the cores are the trainer's; requests keep their KV and wait
                await self.pool.pause("in_place")
            metrics = await asyncio.to_thread(self._train, samples)
            train_s = time.monotonic() - started
            if pause and not self.evals.idle.is_set():  # the eval in flight needs the engines
                await self.pool.resume()
                pause = False
            await self._eval_or_stop()  # an eval in flight measures the weights it started on
            synced = time.monotonic()
            # still paused: the engines take the weights at once, not after their next step
            servers = engines.served(c, self._given_engines)
            sync_bytes = await engines.push(
                self.pool, self.trainer, self.run_dir, step, servers,
                servers and engines.adapter_sync(c),
            )  # fmt: skip
            sync_s = time.monotonic() - synced
            probed, probe_s = None, 0.0
            if self.probe is not None:  # on running engines: a paused one would not answer
                if pause:
                    await self.pool.resume()
                    pause = False
                probed = await probe.check(self.pool, self.trainer, self.probe, step)
                probe_s = time.monotonic() - synced - sync_s
        finally:
            if pause:
                await self.pool.resume()
            self._training = False
        self.step = step
        self.controller.on_step()
        self._gate.set()
        self._room.set()
        record: dict[str, Any] = {**metrics, "step": step}
        record.update(rollout_metrics(step, rollouts, samples))
        record.update(
            {
                "time/elapsed_s": process_elapsed_s(),
                **process_memory(),
                **optimizer_memory(self.trainer),
                "time/wait_rollouts_s": wait_s,
                "time/train_s": train_s,
                "time/weight_sync_s": sync_s,
                "weights/sync_bytes": float(sync_bytes),
                **({"weights/probe_logprob_diff": probed} if probed is not None else {}),
                "time/weight_probe_s": probe_s,
                "rollout/prompts_skipped": float(self.dataset.skipped),
            }
        )
        phases = {"train.wait_rollouts": (waited, wait_s), "train.update": (started, train_s)}
        record_step(self.telemetry, step, {**phases, "weight_sync": (synced, sync_s)}, record)
        return record

    def _train(self, samples: list[TrainSample]) -> dict[str, Any]:
        """The trainer's step, with the allocator's free pages handed back before (what the
        rollouts freed) and after (the step's activations), so they never add up in RSS."""
        release_free_memory()
        try:
            return self.trainer.step(samples)
        finally:
            release_free_memory()

    def _pause_engines_while_training(self) -> bool:
        mode = self.config.loop.engines_while_training
        shared = engines.shares_cpu(self.config, self._given_engines, self.trainer)
        return mode == "pause" or (mode == "auto" and shared)

    async def _eval_or_stop(self) -> None:
        """Wait until no eval is in flight, or the loop is stopping (its eval is discarded)."""
        waits = [asyncio.ensure_future(e.wait()) for e in (self.evals.idle, self._stop)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def _loop_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "dataset": self.dataset.state_dict(),
            "groups": self._group_counter,
            "buffer": dict(self.buffer.counters),
            "controller": self.controller.state_dict(),
        }

    async def _checkpoint(self) -> None:
        await asyncio.to_thread(
            self.trainer.save_checkpoint, self.run_dir / "checkpoints", self._loop_state()
        )

    async def _snapshot(self) -> float:
        """`loop.snapshot_every`: the actor's weights in RUN_DIR/snapshots; the write's seconds."""
        saving = time.monotonic()
        await asyncio.to_thread(self.trainer.export, snapshot_path(self.run_dir, self.step))
        return time.monotonic() - saving

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        try:
            await self._start()
            feeder = asyncio.create_task(self._feed())
            evals: list[asyncio.Task[None]] = []
            last_saved = last_snapshot = self.step
            snapshots = self.config.loop.snapshot_every
            started, last_tokens, last_at = time.monotonic(), self._tokens, time.monotonic()
            generation: tuple[float | None, tuple[int, float] | None] = (None, None)
            stopper = asyncio.create_task(self._stop.wait())
            budget = asyncio.create_task(run_until(self.config.loop.max_minutes))
            every = self.config.eval.every
            if every and self.step == 0:  # the untrained baseline
                evals.append(self.evals.start(0))
            try:
                while self.step < self.config.loop.steps and not budget.done():
                    step_task = asyncio.create_task(self._step())
                    await asyncio.wait(
                        {step_task, stopper, budget}, return_when=asyncio.FIRST_COMPLETED
                    )
                    if not step_task.done():
                        if not self._training:  # stopped while waiting for rollouts
                            step_task.cancel()
                            await asyncio.gather(step_task, return_exceptions=True)
                            break
                        await step_task  # a step being trained finishes, and is kept
                    record = step_task.result()
                    if record is None:  # stopped while waiting for rollouts
                        break
                    now = time.monotonic()
                    record["rollout/tokens_per_s"] = (self._tokens - last_tokens) / (now - last_at)
                    record["time/step_s"] = now - last_at
                    last_tokens, last_at = self._tokens, now
                    # the engines' own rate (between metric polls; kept while none came): a
                    # step trained on groups sampled earlier completes no new tokens itself
                    rate, mark = self.collector.generation_rate(generation[1])
                    generation = (rate if rate is not None else generation[0], mark)
                    if generation[0] is not None:
                        record["engine/generation_tokens_per_s"] = generation[0]
                    record.update(self.controller.gauges())
                    record.update(dispatch_gauges(self.dispatcher, self.step, self._admitted))
                    record.update(self._record_cluster())
                    record.update({f"loop/{k}": v for k, v in self.buffer.counters.items()})
                    if self.step % self.config.loop.checkpoint_every == 0:
                        saving = time.monotonic()
                        await self._checkpoint()
                        record["time/checkpoint_s"] = time.monotonic() - saving
                        last_saved = self.step
                    if snapshots and self.step % snapshots == 0:
                        record["time/snapshot_s"] = await self._snapshot()
                        last_snapshot = self.step
                    self.metrics.log(record)
                    self.progress.update(self.step, record)
                    if every and self.step % every == 0:
                        evals.append(self.evals.start(self.step))
                    if self._stop.is_set():
                        break
                ended = not self._stop.is_set() and (
                    budget.done() or self.step >= self.config.loop.steps
                )
                if ended:  # no more training episodes: the engines are the final eval's
                    self._gate.clear()
                    self.dispatcher.shed(self.dispatcher.inflight, kind="train")
                if ended and every and self.evals.last_step != self.step:
                    evals.append(self.evals.start(self.step))  # the final weights' eval
                if evals and not self._stop.is_set():  # a finished run reports its last eval
                    pending = {task for task in evals if not task.done()}
                    if pending:
                        await asyncio.wait({*pending, stopper}, return_when=asyncio.FIRST_COMPLETED)
                        if not stopper.done():
                            await asyncio.wait(pending)
            finally:
                stopper.cancel()
                budget.cancel()
                self._stop.set()
                self._room.set()
                self._gate.set()
                await self.dispatcher.close()
                feeder.cancel()
                for task in evals:
                    task.cancel()
                await asyncio.gather(feeder, *evals, return_exceptions=True)
                if self.step != last_saved:
                    await self._checkpoint()
                if snapshots and self.step != last_snapshot:
                    await self._snapshot()
            out_of_time = budget.done() and not budget.cancelled()
            print(
                f"stopped at step {self.step} after {time.monotonic() - started:.0f} s"
                + (f" (loop.max_minutes = {self.config.loop.max_minutes})" if out_of_time else "")
                + f"; checkpoint {self.run_dir / 'checkpoints'}",
                flush=True,
            )
            return 0 if self.step >= self.config.loop.steps or out_of_time else 130
        finally:
            await close_all(self.closers, log)
