"""The weight probe: after the run's engines start and after every weight push, each engine
samples a few tokens after a fixed prompt, and its log-probs of them must equal the trainer's
within a tolerance set by the coarser of the two dtypes. Weights that did not reach an engine
whole (a layer its loader skipped, a stale tied output layer) are an error naming the engine and
the layers that explain the difference, never a silent train/inference mismatch.

- The engine samples at the trainer's temperature (the log-probs both sides define alike:
  `tracerl.train.forward`), unseeded (vLLM's CPU build cannot take a seed), ignoring the end of
  sequence so every probe has `PROBE_TOKENS` tokens; each active engine is asked directly, not
  through the pool's routing, so every one of them is checked.
- The trainer scores the same tokens (`Trainer.probe_logprobs`); on a failure it also tries each
  layer at its initial weights (`tracerl.train.probe.suspects`).
- `pool.weight_probe = false` turns it off; `pool.weight_probe_tolerance` overrides the
  tolerance. Simulated engines (`engine.backend = "sim"`, the benchmarks' given engines) have no
  weights to check and are never probed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracerl.config import TrainCommandConfig
from tracerl.engine.types import GenerateRequest, SamplingParams

if TYPE_CHECKING:
    from tracerl.rollout.pool import EnginePool, Member
    from tracerl.run.trainers import AnyTrainer

log = logging.getLogger(__name__)

PROBE_TEXT = "The weights of every layer reach the engine exactly, and the probe proves it: 1 2 3"
PROBE_TOKENS = 8
TOLERANCE = {"float32": 2e-4, "float16": 0.15, "bfloat16": 1.5}
"""Largest |engine - trainer| log-prob over the probe's tokens, by the coarser dtype. On float32
the embedded engine differs by ~2e-6 (`tiny`); an output layer left at its initial weights
differed by 8.4e-4 after one step of `examples/tiny.toml` (lr 1e-4). The half-precision ones
are set from correct engines: SmolLM2-135M on the embedded engine in bfloat16 against the
float32 trainer differed by a median 0.15, a 90th percentile 0.26-0.32 and at most 0.70 over
70 probes (the old 0.2 stopped a correct run at its first probe), in float16 by a median 0.02,
at most 0.06 over 30; scoring in the engine's precision (autocast, or a bfloat16 copy of the
model) came no closer. On an H200 a bfloat16 engine's output layer left at its initial
weights after one step at lr 1e-3 stayed inside 0.2 and was not caught (the float32 engine
catches it): a half-precision probe catches gross faults only (a layer lost or scrambled)."""
_ORDER = ("float32", "float16", "bfloat16")


class WeightProbeError(RuntimeError):
    """An engine whose log-probs of the probe differ from the trainer's after a push."""


@dataclass
class Probe:
    prompt: list[int]
    temperature: float
    tolerance: float


def probe_for(config: TrainCommandConfig, trainer: AnyTrainer) -> Probe | None:
    """The run's probe, or None where it is off (config, or simulated engines)."""
    if not config.pool.weight_probe or config.engine.backend == "sim":
        return None
    from tracerl.rollout.backends import resolved_dtype

    dtypes = (resolved_dtype(config.engine), config.trainer.dtype)
    coarser = max(dtypes, key=_ORDER.index)
    tolerance = config.pool.weight_probe_tolerance or TOLERANCE[coarser]
    prompt = list(trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    return Probe(prompt, config.trainer.temperature, tolerance)


async def check(pool: EnginePool, trainer: AnyTrainer, probe: Probe, version: int) -> float:
    """Probe every active engine of `pool` at weight `version`; the largest difference seen.
    Raises `WeightProbeError` for the first engine beyond the tolerance. One whose request
    fails (it died since the push) is logged and left to the pool's health checks."""
    members = [m for m in pool.members if m.active]
    outputs = await asyncio.gather(
        *(_sample(m, probe, pool.adapter) for m in members), return_exceptions=True
    )
    worst = 0.0
    for member, output in zip(members, outputs, strict=True):
        if isinstance(output, BaseException):  # lost since the push: the pool's to replace
            log.warning("engine %s could not be probed at v%d: %r", member.name, version, output)
            continue
        ids, engine_lps = output
        tokens = probe.prompt + ids
        ours = await asyncio.to_thread(trainer.probe_logprobs, tokens, len(probe.prompt))
        diff = max(abs(a - b) for a, b in zip(ours, engine_lps, strict=True))
        worst = max(worst, diff)
        if diff > probe.tolerance:
            suspects = await asyncio.to_thread(
                trainer.probe_suspects, tokens, len(probe.prompt), engine_lps
            )
            raise WeightProbeError(_message(member, version, diff, probe.tolerance, suspects))
    log.debug("weight probe at v%d: largest log-prob difference %.3g", version, worst)
    return worst


async def _sample(
    member: Member, probe: Probe, adapter: str | None
) -> tuple[list[int], list[float]]:
    request = GenerateRequest(
        input_ids=probe.prompt,
        lora_path=adapter,  # the run's LoRA adapter, when its engines apply one
        sampling_params=SamplingParams(
            max_new_tokens=PROBE_TOKENS, temperature=probe.temperature, ignore_eos=True
        ),
    )
    out: Any = await member.engine.generate(request)
    return list(out.output_ids), list(out.output_logprobs)


def _message(
    member: Member, version: int, diff: float, tolerance: float, suspects: list[str]
) -> str:
    what = (
        f"the layers that explain it at their initial weights: {', '.join(suspects)}"
        if suspects
        else "no single layer at its initial weights explains it"
    )
    launcher = member.launcher
    name, log_path = getattr(launcher, "name", None), getattr(launcher, "log_path", None)
    where = f" ({name}, log {log_path})" if name and log_path else ""
    return (
        f"engine {member.name!r}{where}: after loading the weights of step {version}, its "
        f"log-probs of the probe differ from the trainer's by up to {diff:.3g} (tolerance "
        f"{tolerance:g}); {what}. The engine did not receive these weights whole: training on "
        "its samples would train on a model it is not running (pool.weight_probe = false skips "
        "this check)"
    )
