"""Mixture-of-experts models: routing recorded by the embedded engine (both forward paths, the
prefix cache, the pool's abort and resume, the gateway's trace), and replayed by the trainer.
Random two-layer Qwen2/Qwen3-MoE and Mixtral models (`tests/families.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch

from tests.families import build_family
from tracerl.config import EngineConfig
from tracerl.config.train import MoeConfig, TrainerConfig
from tracerl.engine.local import LocalEngine
from tracerl.engine.types import GenerateOutput, GenerateRequest, SamplingParams
from tracerl.rollout.pool import EnginePool, Member
from tracerl.routing import RoutingCapture, missing, routers
from tracerl.train import Trainer, TrainSample
from tracerl.train.batch import PackedBatch
from tracerl.train.forward import all_logprobs
from tracerl.train.replay import replayed

MOE = ("qwen3-moe", "qwen2-moe", "mixtral")


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe")
    return {name: build_family(name, root / name) for name in MOE}


def own_routing(model: Any, ids: list[int]) -> np.ndarray:
    """An independent full forward of `ids`: what the model's routers choose for each."""
    capture = RoutingCapture(model)
    with torch.no_grad(), capture.capture():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    return capture.take()


def engine(path: Path, **options: Any) -> LocalEngine:
    config = {"device": "cpu", "kv_cache_tokens": 8192, "max_model_len": 2048, **options}
    return LocalEngine(EngineConfig(model=str(path), **config))


def request(rid: str, prompt: list[int], n: int, seed: int = 0, **options: Any) -> GenerateRequest:
    params = SamplingParams(max_new_tokens=n, temperature=1.0, seed=seed, ignore_eos=True)
    return GenerateRequest(rid=rid, input_ids=prompt, sampling_params=params, **options)


def assert_routing_is_the_models(model: Any, ids: list[int], routing: np.ndarray) -> None:
    """A row per token; every fed position's is the model's own choice, the last unrecorded."""
    assert routing.shape == (len(ids), len(routers(model)), routers(model)[0].top_k)
    assert (routing[-1] == missing(routing.dtype)).all()
    np.testing.assert_array_equal(routing[:-1], own_routing(model, ids[:-1]))


@pytest.mark.parametrize("forward", ["slots", "generic"])
@pytest.mark.parametrize("family", MOE)
async def test_recorded_routing_is_what_the_routers_chose(
    family: str, forward: str, moe_models: dict[str, Path]
) -> None:
    """Three concurrent requests (prefills and decodes in one batch): each position's recorded
    experts equal an independent forward's; a request that does not ask gets none."""
    eng = engine(moe_models[family], forward=forward)
    prompts = [list(range(100 + 40 * i, 120 + 50 * i)) for i in range(3)]
    async with eng:
        outs = await asyncio.gather(
            *(
                eng.generate(request(f"r{i}", p, 16, seed=i, return_routed_experts=True))
                for i, p in enumerate(prompts)
            ),
            eng.generate(request("plain", prompts[0], 4)),
        )
    for prompt, out in zip(prompts, outs, strict=False):
        assert out.routed_experts is not None and out.routed_experts.dtype == np.uint8
        assert_routing_is_the_models(eng.model, prompt + out.output_ids, out.routed_experts)
    assert outs[-1].routed_experts is None


async def test_a_cached_prefix_keeps_its_routing(moe_models: dict[str, Path]) -> None:
    """A second turn extending the first prefills only its new tokens; the routing of the
    cached positions comes with them."""
    eng = engine(moe_models["qwen3-moe"])
    async with eng:
        first = await eng.generate(
            request("t0", list(range(200, 240)), 12, return_routed_experts=True)
        )
        prompt = list(range(200, 240)) + first.output_ids + list(range(300, 310))
        second = await eng.generate(request("t1", prompt, 12, return_routed_experts=True))
        hits = eng.stats().prefix_cache_hits_total
    assert hits >= 40  # the first turn's tokens were not prefilled again
    assert second.routed_experts is not None
    assert_routing_is_the_models(eng.model, prompt + second.output_ids, second.routed_experts)


async def test_a_dense_model_records_nothing(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    eng = LocalEngine(EngineConfig(model="tiny", device="cpu"), model, tokenizer)
    assert eng.scheduler.capture is None  # no routers: no hooks, no per-step work
    async with eng:
        out = await eng.generate(request("d", list(range(50, 60)), 4, return_routed_experts=True))
    assert out.routed_experts is None


class AbortOnce:
    """An engine that aborts its first request on the real engine after its first tokens."""

    def __init__(self, inner: LocalEngine) -> None:
        self.inner, self.aborted = inner, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate_stream(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        async for chunk in self.inner.generate_stream(req):
            if not self.aborted and chunk.output_ids:
                self.aborted = True
                await self.inner.abort(req.rid)
            yield chunk


async def test_routing_survives_an_abort_and_resume(moe_models: dict[str, Path]) -> None:
    """The pool resumes an aborted request from its tokens so far: the caller gets one routing
    record over the whole sequence, the aborted attempt's positions and the resumed one's."""
    eng = engine(moe_models["qwen3-moe"])
    pool = EnginePool([Member("local", AbortOnce(eng))])  # type: ignore[arg-type]
    prompt = list(range(400, 430))
    async with eng:
        chunks = [
            c
            async for c in pool.generate_stream(
                request("a", prompt, 600, return_routed_experts=True)
            )
        ]
    assert pool.counters["aborted_resumed"] == 1
    assert [c.routed_experts is None for c in chunks] == [True] * (len(chunks) - 1) + [False]
    ids = prompt + [t for c in chunks for t in c.output_ids]
    assert len(ids) == len(prompt) + 600
    assert_routing_is_the_models(eng.model, ids, chunks[-1].routed_experts)


async def test_a_trajectory_carries_its_routing_token_by_token(
    moe_models: dict[str, Path], make_gateway: Any
) -> None:
    """Two turns of one session through the gateway and its SQLite store: each turn records
    the routing of its prompt and completion, and the trajectory's rows align with its token
    ids (every fed position the model's own choice)."""
    eng = engine(moe_models["mixtral"])
    async with eng:
        gw = await make_gateway(eng)
        session = await gw.open_session()
        client = openai.AsyncOpenAI(
            base_url=session["openai_base_url"], api_key=session["api_key"], max_retries=0
        )
        messages: list[Any] = [{"role": "user", "content": "Count to three."}]
        reply = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "And to four?"},
        ]
        await client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
        trace = await gw.trace(session["session_id"])
    assert len(trace["turns"]) == 2 and len(trace["trajectories"]) == 1
    from tracerl.trace.schema import SessionTrace

    parsed = SessionTrace.model_validate(trace)
    for turn in parsed.turns:
        assert turn.routed_experts is not None
        assert turn.routed_experts.shape[0] == len(turn.prompt_ids) + len(turn.completion_ids)
    trajectory = parsed.trajectories[0]
    assert trajectory.routed_experts is not None
    assert_routing_is_the_models(eng.model, trajectory.token_ids, trajectory.routed_experts.array())
    sample = TrainSample.from_trajectory(trajectory, reward=1.0)
    assert sample.routed_experts is not None and sample.routed_experts.shape[0] == len(
        sample.token_ids
    )


class Forced:
    """Routers that take the experts ranked 2..k+1 instead of 1..k (weights from the router's
    probabilities as replay computes them): an engine whose routing differs from the
    trainer's own by construction."""

    def __init__(self, model: Any) -> None:
        self.handles = [r.register_forward_hook(self.hook) for r in routers(model)]

    @staticmethod
    def hook(module: Any, args: Any, output: Any) -> Any:
        logits, scores, _ = output
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        chosen = probs.topk(module.top_k + 1, dim=-1).indices[:, 1:]
        weights = probs.gather(-1, chosen)
        if getattr(module, "norm_topk_prob", True):
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, weights.to(scores.dtype), chosen


def score(trainer: Trainer, samples: list[TrainSample]) -> torch.Tensor:
    batch = PackedBatch.build(samples, trainer.device, routing=trainer.replay)
    mbs = trainer.micro_batches(batch, list(range(len(samples))))
    return all_logprobs(trainer.actor, mbs, batch.token_ids.numel(), 1.0, trainer.device)[
        batch.loss_mask.bool()
    ]


@pytest.mark.parametrize("family", MOE)
async def test_replay_reproduces_the_engines_log_probs_where_top_k_differs(
    family: str, moe_models: dict[str, Path]
) -> None:
    """The engine routes differently from the trainer on every token (`Forced`); the trainer
    replaying the recorded routing computes the engine's log-probs, routing by itself it
    does not. Two samples of a group share their prompt (a tree row)."""
    path = moe_models[family]
    eng = engine(path)
    Forced(eng.model)
    prompt = list(range(500, 540))
    async with eng:
        outs = await asyncio.gather(
            *(
                eng.generate(request(f"f{i}", prompt, 24, seed=i, return_routed_experts=True))
                for i in range(2)
            )
        )
    samples = [
        TrainSample(prompt + o.output_ids, [0] * len(prompt) + [1] * 24,
                    [0.0] * len(prompt) + o.output_logprobs, float(i), 0,
                    routed_experts=o.routed_experts)
        for i, o in enumerate(outs)
    ]  # fmt: skip
    engine_lps = torch.tensor([lp for o in outs for lp in o.output_logprobs])
    replay = Trainer(TrainerConfig(model=str(path), token_budget=4096), device="cpu")
    recompute = Trainer(
        TrainerConfig(model=str(path), token_budget=4096, moe=MoeConfig(routing="recompute")),
        device="cpu",
    )
    assert replay.replay and not recompute.replay
    assert (score(replay, samples) - engine_lps).abs().max().item() < 1e-4
    assert (score(recompute, samples) - engine_lps).abs().max().item() > 1e-2


@pytest.mark.parametrize("family", MOE)
def test_replaying_the_models_own_routing_changes_nothing_and_keeps_the_router_gradient(
    family: str, moe_models: dict[str, Path]
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_models[family])
    ids = list(range(600, 640))
    own = torch.from_numpy(own_routing(model, ids).astype(np.int64))[None]  # [1, T, L, k]
    plain = model(input_ids=torch.tensor([ids])).logits
    with replayed(model, own):
        out = model(input_ids=torch.tensor([ids])).logits
    assert (out - plain).abs().max().item() < 1e-5
    out.float().logsumexp(-1).sum().backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers(model))


def test_replay_refuses_routers_it_cannot_replay() -> None:
    class FancyTopKRouter(torch.nn.Module):
        top_k, num_experts = 2, 8

    from tracerl.train.replay import check_replayable

    model = torch.nn.Sequential(FancyTopKRouter())
    with pytest.raises(
        ValueError, match=r"not FancyTopKRouter; set trainer.moe.routing = 'recompute'"
    ):
        check_replayable(model)
