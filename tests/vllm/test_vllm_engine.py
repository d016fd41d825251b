"""tracerl over a real vLLM server (vLLM's CPU build) serving SmolLM2-135M-Instruct: exact ids
and log-probs recorded through the gateway, streaming, abort and resume, weight updates, a
kill -9 survived, and the collector reading vLLM's /metrics. One server for the module, launched
by the engine pool as `tracerl train` launches it; the kill -9 test runs last (it restarts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import aiohttp
import openai
import pytest
import torch

from tests.conftest import reference_logprobs
from tests.waiting import wait_until
from tracerl.control.collector import MetricsCollector
from tracerl.engine.server import start_server
from tracerl.engine.types import GenerateRequest
from tracerl.engine.vllm import VLLMClient
from tracerl.gateway.server import Gateway
from tracerl.gateway.store import SQLiteTraceStore
from tracerl.rollout.launcher import ProcessLauncher
from tracerl.rollout.pool import EnginePool

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

# vLLM's CPU kernels (fused attention, its own matmul order) and an HF forward in float32 differ
# by rounding alone: over 40 turns of the vLLM quickstart (weights v0) the largest |delta| on a
# sampled token was 3.1e-5 nats. 2e-3 leaves 60x room for longer contexts and stays far below
# what a real mismatch moves (another temperature, truncation, a shifted position, the wrong
# token): the test also checks a second turn sampled at T=0.7 against the T=0.7 reference.
LOGPROB_TOLERANCE = 2e-3


def request(rid: str, n: int, **params: Any) -> GenerateRequest:
    return GenerateRequest(
        rid=rid,
        input_ids=[1, 504, 3458, 314, 253],
        sampling_params={"max_new_tokens": n, "ignore_eos": True, **params},
    )


@contextlib.asynccontextmanager
async def gateway_session(
    pool: EnginePool, tokenizer: Any, tmp_path: Path
) -> AsyncIterator[tuple[openai.AsyncOpenAI, Callable[[], Awaitable[dict[str, Any]]]]]:
    """A gateway over the vLLM pool on 127.0.0.1 and one session on it: the session's openai
    client, and a function reading its trace."""
    store = SQLiteTraceStore(tmp_path / "traces.sqlite")
    gateway = Gateway(pool, tokenizer, store, model_name="smollm2-135m",
                      eos_ids={tokenizer.eos_token_id}, max_model_len=8192)  # fmt: skip
    runner, port = await start_server(gateway.app(), "127.0.0.1", 0, cancel_on_disconnect=False)
    url, admin = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {gateway.admin_key}"}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/sessions", headers=admin) as resp:
                session = await resp.json()

            async def trace() -> dict[str, Any]:
                async with http.get(f"{url}/sessions/{session['session_id']}", headers=admin) as r:
                    return dict(await r.json())

            async with openai.AsyncOpenAI(
                base_url=session["openai_base_url"], api_key=session["api_key"]
            ) as client:
                yield client, trace
    finally:
        await runner.cleanup()
        await store.close()


async def test_ids_and_logprobs_recorded_through_the_gateway_are_the_models(
    vllm_pool: EnginePool, smol: tuple[Any, Any], tmp_path: Path
) -> None:
    model, tokenizer = smol
    async with gateway_session(vllm_pool, tokenizer, tmp_path) as (client, read_trace):
        messages: Any = [{"role": "user", "content": "Name three colours."}]
        reply = await client.chat.completions.create(
            model="m", messages=messages, max_tokens=24, temperature=1.0
        )
        streamed = await client.chat.completions.create(
            model="m", messages=messages, max_tokens=24, temperature=0.7, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
        trace = await read_trace()
    first, second = trace["turns"]
    assert reply.choices[0].message.content
    assert tokenizer.decode(second["completion_ids"], skip_special_tokens=True).startswith(text)
    for turn, temperature in ((first, 1.0), (second, 0.7)):
        ids, logprobs = turn["completion_ids"], turn["completion_logprobs"]
        assert ids and len(ids) == len(logprobs)
        reference = reference_logprobs(model, turn["prompt_ids"], ids, temperature)
        delta = (torch.tensor(logprobs) - reference).abs().max().item()
        assert delta < LOGPROB_TOLERANCE, f"T={temperature}: max |logprob delta| {delta:.2e}"
        assert turn["weight_version"] == 0


async def test_an_abort_returns_partial_output_and_the_pool_resumes_it(
    vllm_pool: EnginePool,
) -> None:
    chunks: list[Any] = []

    async def run() -> None:
        async for chunk in vllm_pool.generate_stream(request("abort-1", 200)):
            chunks.append(chunk)

    task = asyncio.create_task(run())
    await wait_until(lambda: sum(len(c.output_ids) for c in chunks) >= 20, "20 tokens", 120)
    engine = vllm_pool.members[0].engine
    assert isinstance(engine, VLLMClient)
    assert await engine.abort("abort-1") == 1
    await asyncio.wait_for(task, 300)
    ids = [i for c in chunks for i in c.output_ids]
    assert len(ids) == 200 and chunks[-1].finish_reason == "length"
    assert len([lp for c in chunks for lp in c.output_logprobs]) == 200
    assert vllm_pool.counters["aborted_resumed"] >= 1


async def test_a_weight_update_changes_the_outputs_and_bumps_the_version(
    vllm_pool: EnginePool, smol: tuple[Any, Any], tmp_path: Path
) -> None:
    from tracerl.models import resolve_model

    greedy = {"temperature": 0.0}
    before = await vllm_pool.generate(request("w-0", 12, **greedy))
    model, tokenizer = smol
    changed = tmp_path / "changed"
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if "layers.29.mlp" in name:
                tensor.mul_(-3.0)  # the last block's MLP, reversed and scaled: other tokens
    model.save_pretrained(changed)
    model.load_state_dict(state)  # the shared reference model is left as it was
    tokenizer.save_pretrained(changed)
    await vllm_pool.update_weights(str(changed), 1)
    after = await vllm_pool.generate(request("w-1", 12, **greedy))
    assert after.weight_version == 1 and after.output_ids != before.output_ids
    assert (await vllm_pool.model_info())["weight_version"] == 1
    await vllm_pool.update_weights(str(resolve_model("smollm2-135m")), 2)
    restored = await vllm_pool.generate(request("w-2", 12, **greedy))
    assert restored.weight_version == 2 and restored.output_ids == before.output_ids


async def test_an_in_place_update_labels_each_token_with_its_weights(
    vllm_pool: EnginePool,
) -> None:
    from tracerl.models import resolve_model

    chunks: list[Any] = []

    async def run() -> None:
        async for chunk in vllm_pool.generate_stream(request("inplace-1", 150)):
            chunks.append(chunk)

    task = asyncio.create_task(run())
    await wait_until(lambda: sum(len(c.output_ids) for c in chunks) >= 10, "10 tokens", 120)
    await vllm_pool.update_weights(str(resolve_model("smollm2-135m")), 3)
    await asyncio.wait_for(task, 300)
    assert sum(len(c.output_ids) for c in chunks) == 150
    assert chunks[-1].weight_version == 3 and chunks[-1].weight_version_min == 2
    assert vllm_pool.counters["aborted_resumed"] <= 1  # in place: nothing was aborted here


async def test_after_an_update_a_cached_prompt_is_scored_by_the_new_weights(
    vllm_pool: EnginePool, smol: tuple[Any, Any], tmp_path: Path
) -> None:
    """vLLM keeps its prefix cache across a reload unless told: a prompt seen before the update
    would reuse K/V of the old weights. Its first block's MLP changed, every later K/V moves."""
    from tracerl.models import resolve_model

    prompt = list(range(1000, 1300))  # two whole blocks of vLLM's CPU build (128 tokens)
    greedy = GenerateRequest(
        rid="cached-0",
        input_ids=prompt,
        sampling_params={"max_new_tokens": 4, "ignore_eos": True, "temperature": 0.0},
    )
    await vllm_pool.generate(greedy)  # the prompt's blocks are now cached
    model, tokenizer = smol
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if "layers.0.mlp" in name:
                tensor.mul_(-3.0)
    model.save_pretrained(tmp_path / "changed")
    tokenizer.save_pretrained(tmp_path / "changed")
    try:
        await vllm_pool.update_weights(str(tmp_path / "changed"), 4)
        after = await vllm_pool.generate(greedy.model_copy(update={"rid": "cached-1"}))
        expected = reference_logprobs(model, prompt, after.output_ids, 0.0)
    finally:
        model.load_state_dict(state)  # the shared reference model is left as it was
        await vllm_pool.update_weights(str(resolve_model("smollm2-135m")), 5)
    assert after.weight_version == 4
    torch.testing.assert_close(
        torch.tensor(after.output_logprobs), expected, atol=LOGPROB_TOLERANCE, rtol=0
    )


async def test_many_concurrent_seeded_requests_do_not_kill_the_engine(
    vllm_pool: EnginePool,
) -> None:
    # seeded requests killed vLLM's CPU build (`CPU Generator does not use offset`) in
    # `tracerl bench engine --backend vllm --quick`: on CPU the adapter sends them unseeded
    engine = vllm_pool.members[0].engine
    assert isinstance(engine, VLLMClient) and engine.seeds is False
    requests = [request(f"seed-{i}", 8 + (i * 7) % 72, seed=i, temperature=0.7) for i in range(64)]
    outs = await asyncio.wait_for(asyncio.gather(*map(vllm_pool.generate, requests)), 600)
    assert [len(o.output_ids) for o in outs] == [8 + (i * 7) % 72 for i in range(64)]
    assert vllm_pool.counters["restarts"] == 0


async def test_a_request_without_a_budget_gets_the_engines_default(
    vllm_pool: EnginePool,
) -> None:
    # an agent that sends no budget (Codex) generated to the end of the context on vLLM, where
    # the embedded engine stops at engine.default_max_new_tokens: the adapter applies it too
    engine = vllm_pool.members[0].engine
    assert isinstance(engine, VLLMClient) and engine.default_max_new_tokens == 1024
    client = VLLMClient(engine.base_url, 120, seeds=False, default_max_new_tokens=6)
    try:
        out = await client.generate(
            GenerateRequest(
                rid="no-budget", input_ids=[1, 504], sampling_params={"ignore_eos": True}
            )
        )
    finally:
        await client.close()
    assert len(out.output_ids) == 6 and out.finish_reason == "length"


async def test_the_collector_reads_vllms_metrics(vllm_pool: EnginePool) -> None:
    collector = MetricsCollector(vllm_pool.engines, lambda samples, now: None)
    [load] = await collector.poll_once()
    assert load.capacity_tokens >= 32768 and load.max_model_len == 1024
    assert not load.paused
    await vllm_pool.generate(request("metrics-1", 16))
    await collector.poll_once()
    assert collector.generated_tokens >= 16


async def test_forced_tool_calls_through_the_responses_api_on_vllm(
    vllm_pool: EnginePool, smol: tuple[Any, Any], tmp_path: Path
) -> None:
    """`tool_choice` naming a function, and "required" with two tools: the gateway writes the
    call's start into the prompt and vLLM's structured outputs hold what SmolLM2 samples after
    it (at temperature 1) to the tools' schemas."""
    _, tokenizer = smol
    weather = {
        "type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {
            "type": "object", "additionalProperties": False, "required": ["city", "days"],
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                           "days": {"type": "integer", "minimum": 1, "maximum": 5}},
        },
    }  # fmt: skip
    clock = {
        "type": "function", "name": "clock", "description": "The time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    }  # fmt: skip
    choices: list[Any] = [{"type": "function", "name": "get_weather"}] * 3 + ["required"] * 3
    replies = []
    async with gateway_session(vllm_pool, tokenizer, tmp_path) as (client, read_trace):
        for choice in choices:
            replies.append(
                await client.responses.create(
                    model="m", input="What is the weather in Paris?", tools=[weather, clock],  # type: ignore[list-item]
                    tool_choice=choice, temperature=1.0, max_output_tokens=48,
                )
            )  # fmt: skip
        trace = await read_trace()
    turns = trace["turns"]
    assert tokenizer.decode(turns[0]["prompt_ids"]).endswith(
        '<tool_call>\n{"name": "get_weather", "arguments": '
    )
    assert tokenizer.decode(turns[3]["prompt_ids"]).endswith("<tool_call>\n")
    for choice, reply, turn in zip(choices, replies, turns, strict=True):
        sampled = tokenizer.decode(turn["completion_ids"])
        calls = [item for item in reply.output if item.type == "function_call"]
        assert len(calls) == 1, sampled
        call = calls[0]
        args = json.loads(call.arguments)
        if call.name == "get_weather":
            assert args["city"] in ("Paris", "Rome") and 1 <= args["days"] <= 5, sampled
        else:
            assert choice == "required" and call.name == "clock" and args == {}, sampled
    for traj in trace["trajectories"]:  # each turn's own trajectory: its samples, loss 1
        turn = turns[traj["turn_indices"][0]]
        assert sum(traj["loss_mask"]) == len(turn["completion_ids"])


async def test_kill_9_of_the_server_mid_generation_is_survived(vllm_pool: EnginePool) -> None:
    chunks: list[Any] = []

    async def run() -> None:
        async for chunk in vllm_pool.generate_stream(request("kill-1", 120)):
            chunks.append(chunk)

    served = (await vllm_pool.model_info())["weight_version"]  # the last update's
    task = asyncio.create_task(run())
    await wait_until(lambda: sum(len(c.output_ids) for c in chunks) >= 10, "10 tokens", 120)
    launcher = vllm_pool.members[0].launcher
    assert isinstance(launcher, ProcessLauncher) and launcher.pid is not None
    os.killpg(launcher.pid, signal.SIGKILL)  # the API server and its engine core at once
    await asyncio.wait_for(task, 900)  # restarted (a fresh vLLM start), then resumed
    assert sum(len(c.output_ids) for c in chunks) == 120
    assert chunks[-1].finish_reason == "length"
    assert vllm_pool.counters["restarts"] == 1
    assert served > 0  # the tests before it updated the weights
    assert (await vllm_pool.model_info())["weight_version"] == served  # restarted on them


async def test_structured_outputs_on_vllm_validate_and_are_recorded(
    vllm_pool: EnginePool, smol: tuple[Any, Any], tmp_path: Path
) -> None:
    """`response_format` json_schema (through the SDK's parse helper, whole and streamed) and
    the Responses API's `text.format`: vLLM's structured outputs hold what SmolLM2 samples at
    temperature 1 to the schema, and each reply is recorded like any turn."""
    from pydantic import BaseModel

    class Trip(BaseModel):
        city: Literal["Paris", "Rome", "Lima"]
        days: Literal[1, 2, 3]
        by_train: bool

    _, tokenizer = smol
    question = [{"role": "user", "content": "Plan a short trip."}]
    parsed: list[Any] = []
    async with gateway_session(vllm_pool, tokenizer, tmp_path) as (client, read_trace):
        for _ in range(3):
            reply = await client.chat.completions.parse(
                model="m", messages=question, response_format=Trip, temperature=1.0,  # type: ignore[arg-type]
                max_tokens=64,
            )  # fmt: skip
            parsed.append(reply.choices[0].message.parsed)
        async with client.chat.completions.stream(
            model="m", messages=question, response_format=Trip, temperature=1.0,  # type: ignore[arg-type]
            max_tokens=64,
        ) as stream:  # fmt: skip
            parsed.append((await stream.get_final_completion()).choices[0].message.parsed)
        answer = await client.responses.parse(
            model="m", input="Plan a short trip.", text_format=Trip, max_output_tokens=64
        )
        parsed.append(answer.output_parsed)
        trace = await read_trace()
    assert all(isinstance(p, Trip) for p in parsed), parsed
    turns = trace["turns"]
    assert len(turns) == 5
    for turn, value in zip(turns, parsed, strict=True):
        text = tokenizer.decode(turn["completion_ids"], skip_special_tokens=True)
        assert Trip.model_validate_json(text) == value  # the record is what the client parsed
        assert turn["finish_reason"] == "stop"


async def test_an_update_reaches_a_tied_output_layer(
    vllm_pool: EnginePool, smol: tuple[Any, Any], tmp_path: Path
) -> None:
    """SmolLM2 ties its output layer to its embedding. An update exported by the trainer
    (`export_hf`) that changes the embedding must change the output layer vLLM samples with
    too: its log-probs after the update are the updated model's (vLLM's layerwise reload had
    kept the output layer it had, the initial one, logging "ParallelLMHead: Failed to load
    weights")."""
    from tracerl.train.checkpoint import export_hf

    model, tokenizer = smol
    assert model.config.tie_word_embeddings
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    with torch.no_grad():  # the embedding, and with it the tied output layer
        embedding = model.get_input_embeddings().weight
        embedding.add_(0.05 * torch.randn_like(embedding))
    try:
        export_hf(tmp_path / "tied", model, tokenizer)
        await vllm_pool.update_weights(str(tmp_path / "tied"), 20)
        prompt = tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
        out = await vllm_pool.generate(
            GenerateRequest.model_validate(
                {"rid": "tied-1", "input_ids": prompt,
                 "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "seed": 3}}
            )
        )  # fmt: skip
        reference = reference_logprobs(model, prompt, out.output_ids, 1.0)
    finally:
        model.load_state_dict(state)  # the shared reference model is left as it was
        # vLLM keeps the output layer of an update that names none: restore it by name too
        await vllm_pool.update_weights(str(export_hf(tmp_path / "base", model, tokenizer)), 21)
    delta = (torch.tensor(out.output_logprobs) - reference).abs().max().item()
    assert out.weight_version == 20
    assert delta < LOGPROB_TOLERANCE, f"max |logprob delta| {delta:.2e} after a tied update"


async def test_the_weight_probe_passes_a_whole_update_and_names_a_stale_tied_layer(
    vllm_pool: EnginePool, tmp_path: Path
) -> None:
    """The probe `tracerl train` runs after every push (`tracerl.run.probe`), on vLLM with
    SmolLM2's tied output layer and a real `Trainer`: an update without the output layer's file
    (what exports were before the fix) leaves vLLM on the output layer it had, the initial one
    here, and the check fails naming the engine and that layer; the whole export passes."""
    import shutil

    from tracerl.config.train import TrainerConfig
    from tracerl.run.probe import PROBE_TEXT, TOLERANCE, Probe, WeightProbeError, check
    from tracerl.train import Trainer
    from tracerl.train.checkpoint import TIED_HEAD_FILE, export_hf

    trainer = Trainer(TrainerConfig(model="smollm2-135m"), device="cpu")
    prompt = trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    probe = Probe(prompt, 1.0, TOLERANCE["float32"])
    base = export_hf(tmp_path / "base", trainer.actor, trainer.tokenizer)  # every layer named
    torch.manual_seed(1)
    with torch.no_grad():
        embedding = trainer.actor.get_input_embeddings().weight
        embedding.add_(0.05 * torch.randn_like(embedding))
    whole = export_hf(tmp_path / "whole", trainer.actor, trainer.tokenizer)
    stale = tmp_path / "stale"
    shutil.copytree(whole, stale)
    (stale / TIED_HEAD_FILE).unlink()
    try:
        await vllm_pool.update_weights(str(base), 30)  # the initial weights, output layer too
        await vllm_pool.update_weights(str(stale), 31)
        with pytest.raises(WeightProbeError) as failed:
            await check(vllm_pool, trainer, probe, 31)
        await vllm_pool.update_weights(str(whole), 32)
        passed = await check(vllm_pool, trainer, probe, 32)
    finally:
        await vllm_pool.update_weights(str(base), 33)
    message = str(failed.value)
    assert message.startswith("engine 'launched-0' (vllm engine 0, log "), message
    assert "after loading the weights of step 31, its log-probs" in message
    assert "initial weights: lm_head (tied to model.embed_tokens)." in message, message
    assert passed < probe.tolerance


async def test_an_exported_checkpoint_is_what_vllm_serves(
    vllm_pool: EnginePool, tmp_path: Path
) -> None:
    """`tracerl export` of a trainer's checkpoint loads into vLLM as the trained model: after
    the update, the probe's log-probs on vLLM equal the trainer's."""
    from tracerl.cli.main import main
    from tracerl.config.train import TrainerConfig
    from tracerl.run.probe import PROBE_TEXT, TOLERANCE, Probe, check
    from tracerl.train import Trainer
    from tracerl.train.checkpoint import export_hf

    trainer = Trainer(TrainerConfig(model="smollm2-135m"), device="cpu")
    base = export_hf(tmp_path / "base", trainer.actor, trainer.tokenizer)
    torch.manual_seed(2)
    with torch.no_grad():  # as a few steps would: every layer moves
        for p in trainer.actor.parameters():
            p.add_(0.01 * torch.randn_like(p))
    trainer.save_checkpoint(tmp_path / "run" / "checkpoints")
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "exported")]) == 0
    prompt = trainer.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    try:
        await vllm_pool.update_weights(str(tmp_path / "exported"), 40)
        diff = await check(vllm_pool, trainer, Probe(prompt, 1.0, TOLERANCE["float32"]), 40)
    finally:
        await vllm_pool.update_weights(str(base), 41)
    assert diff < TOLERANCE["float32"]
