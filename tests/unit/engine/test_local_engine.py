"""The embedded engine through its Python API (the HTTP surface is in tests/integration)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.conftest import reference_logprobs
from tests.waiting import wait_until
from tracerl.engine.types import GenerateRequest, RequestError
from tracerl.engine.weights import WeightLoadError


def req(ids: list[int], **sampling) -> GenerateRequest:
    return GenerateRequest(input_ids=ids, sampling_params=sampling)


def prompt(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def forcing_weights(engine, favoured: list[int]) -> list[tuple[str, torch.Tensor]]:
    """Weights under which the model always samples among `favoured`.

    A large constant in embedding dimension 0 dominates the residual stream, so the final hidden
    state's dimension 0 is large and positive at every position; only the favoured rows of the
    output layer read that dimension.
    """
    params = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    params["model.embed_tokens.weight"][:, 0] = 100.0
    params["lm_head.weight"][:, 0] = 0.0
    params["lm_head.weight"][favoured, 0] = 50.0
    return list(params.items())


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
async def test_batched_logprobs_match_an_independent_forward(make_engine, temperature) -> None:
    engine = make_engine()
    shapes = [(3, 17), (11, 5), (7, 29), (20, 12)]  # (prompt length, completion length)
    requests = [
        req(
            prompt(p, 100 + 50 * i),
            max_new_tokens=n,
            temperature=temperature,
            seed=i,
            ignore_eos=True,
            top_p=0.9 if i == 1 else 1.0,
        )
        for i, (p, n) in enumerate(shapes)
    ]
    outs = await asyncio.gather(*(engine.generate(r) for r in requests))
    assert engine.stats().preemptions_total == 0
    for request, out, (_, n) in zip(requests, outs, shapes, strict=True):
        assert out.finish_reason == "length"
        assert len(out.output_ids) == len(out.output_logprobs) == n
        expected = reference_logprobs(engine.model, request.input_ids, out.output_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.output_logprobs), expected)


async def test_requests_join_a_running_batch(make_engine) -> None:
    engine = make_engine()
    long = asyncio.create_task(engine.generate(req(prompt(5), max_new_tokens=400, ignore_eos=True)))
    await wait_until(lambda: engine.stats().generation_tokens_total > 20)
    short = await engine.generate(req(prompt(9, 300), max_new_tokens=10, ignore_eos=True))
    assert not long.done()  # the short request finished while the long one kept decoding
    assert len(short.output_ids) == 10
    assert len((await long).output_ids) == 400


async def test_same_seed_same_tokens_alone_or_batched(make_engine) -> None:
    engine = make_engine()
    r = req(prompt(6), max_new_tokens=24, temperature=1.0, seed=42, ignore_eos=True)
    alone = await engine.generate(r)
    again = await engine.generate(r.model_copy(update={"rid": "again"}))
    others = [req(prompt(4 + i, 700), max_new_tokens=30, seed=i) for i in range(3)]
    batched, *_ = await asyncio.gather(
        engine.generate(r.model_copy(update={"rid": "batched"})),
        *(engine.generate(o) for o in others),
    )
    assert alone.output_ids == again.output_ids == batched.output_ids
    different = await engine.generate(
        r.model_copy(
            update={
                "rid": "other-seed",
                "sampling_params": r.sampling_params.model_copy(update={"seed": 7}),
            }
        )
    )
    assert different.output_ids != alone.output_ids


async def test_stop_ids_and_length(make_engine) -> None:
    engine = make_engine()
    greedy = await engine.generate(
        req(prompt(8), max_new_tokens=12, temperature=0.0, ignore_eos=True)
    )
    assert greedy.finish_reason == "length" and len(greedy.output_ids) == 12
    stop = greedy.output_ids[4]
    first = greedy.output_ids.index(stop)
    stopped = await engine.generate(
        req(prompt(8), max_new_tokens=12, temperature=0.0, stop_token_ids=[stop], ignore_eos=True)
    )
    assert stopped.finish_reason == "stop"
    assert stopped.matched_stop == stop
    assert stopped.output_ids == greedy.output_ids[: first + 1]


async def test_eos_stops_unless_ignored(make_engine) -> None:
    engine = make_engine()
    eos = engine.tokenizer.eos_token_id
    await engine.update_weights(forcing_weights(engine, [eos]), weight_version=1)
    out = await engine.generate(req(prompt(4), max_new_tokens=5))
    assert out.finish_reason == "stop" and out.output_ids == [eos]
    ignored = await engine.generate(req(prompt(4), max_new_tokens=5, ignore_eos=True))
    assert ignored.finish_reason == "length" and ignored.output_ids == [eos] * 5


async def test_abort_returns_a_consistent_partial(make_engine) -> None:
    engine = make_engine()
    request = req(prompt(5), max_new_tokens=1500, ignore_eos=True)
    chunks = []

    async def consume() -> None:
        async for chunk in engine.generate_stream(request):
            chunks.append(chunk)

    task = asyncio.create_task(consume())
    await wait_until(lambda: len(chunks) >= 5)
    assert await engine.abort(request.rid) == 1
    await task
    final = chunks[-1]
    ids = [t for c in chunks for t in c.output_ids]
    logprobs = [lp for c in chunks for lp in c.output_logprobs]
    assert final.finish_reason == "abort"
    assert 5 <= len(ids) < 1500
    assert len(ids) == len(logprobs) == final.completion_tokens
    expected = reference_logprobs(engine.model, request.input_ids, ids, 1.0)
    torch.testing.assert_close(torch.tensor(logprobs), expected)
    assert await engine.abort("no-such-request") == 0


async def test_abort_all_covers_waiting_requests(make_engine) -> None:
    engine = make_engine(max_running_requests=1)
    tasks = [
        asyncio.create_task(
            engine.generate(req(prompt(3, 100 + i), max_new_tokens=1000, ignore_eos=True))
        )
        for i in range(3)
    ]
    await wait_until(lambda: engine.stats().waiting == 2 and engine.stats().running == 1)
    assert await engine.abort(abort_all=True) == 3
    outs = await asyncio.gather(*tasks)
    assert [o.finish_reason for o in outs] == ["abort"] * 3
    assert sum(len(o.output_ids) == 0 for o in outs) == 2  # the queued ones never started


async def test_only_admission_refusals_count_as_waiting_for_capacity(make_engine) -> None:
    """What the controller reads as overload: requests admission refused (here: no running
    slot), never arrivals waiting out a pause."""
    from tracerl.control.collector import MetricsCollector

    engine = make_engine(max_running_requests=1)
    loads = []
    collector = MetricsCollector({"e": engine}, lambda samples, now: loads.extend(samples))
    tasks = [
        asyncio.create_task(
            engine.generate(req(prompt(3, 200 + i), max_new_tokens=1000, ignore_eos=True))
        )
        for i in range(3)
    ]
    await wait_until(lambda: engine.stats().waiting_for_capacity == 2)
    await collector.poll_once()
    assert (loads[-1].waiting_for_capacity, loads[-1].paused) == (2, False)
    await engine.pause("in_place")
    await collector.poll_once()
    assert loads[-1].paused and loads[-1].waiting_for_capacity == 0
    assert loads[-1].waiting == 2 and loads[-1].running == 1
    await engine.resume()
    assert await engine.abort(abort_all=True) == 3
    await asyncio.gather(*tasks)


async def test_pause_in_place_holds_everything_until_continue(make_engine) -> None:
    engine = make_engine()
    running = asyncio.create_task(
        engine.generate(req(prompt(4), max_new_tokens=300, ignore_eos=True))
    )
    await wait_until(lambda: engine.stats().generation_tokens_total >= 3)
    await engine.pause("in_place")
    assert engine.stats().paused
    produced = engine.stats().generation_tokens_total
    queued = asyncio.create_task(engine.generate(req(prompt(4, 900), max_new_tokens=4)))
    await wait_until(lambda: engine.stats().waiting == 1)
    done, _ = await asyncio.wait([running, queued], timeout=0.3)
    assert not done
    assert engine.stats().generation_tokens_total == produced
    assert not await engine.health_generate()
    await engine.resume()
    assert len((await running).output_ids) == 300
    assert len((await queued).output_ids) == 4


async def test_pause_retract_keeps_tokens_and_recomputes(make_engine) -> None:
    engine = make_engine()
    request = req(prompt(6), max_new_tokens=60, ignore_eos=True, seed=3)
    task = asyncio.create_task(engine.generate(request))
    await wait_until(lambda: engine.stats().generation_tokens_total >= 10)
    await engine.pause("retract")
    assert engine.stats().running == 0 and engine.stats().waiting == 1
    await engine.resume()
    out = await task
    assert len(out.output_ids) == 60
    expected = reference_logprobs(engine.model, request.input_ids, out.output_ids, 1.0)
    torch.testing.assert_close(torch.tensor(out.output_logprobs), expected)


async def test_pause_abort_finishes_everything(make_engine) -> None:
    engine = make_engine()
    task = asyncio.create_task(engine.generate(req(prompt(4), max_new_tokens=900, ignore_eos=True)))
    await wait_until(lambda: engine.stats().generation_tokens_total >= 2)
    await engine.pause("abort")
    assert (await task).finish_reason == "abort"
    await engine.resume()
    assert (await engine.generate(req(prompt(4), max_new_tokens=2))).finish_reason is not None


async def test_preemption_under_a_small_kv_budget_keeps_logprobs_exact(make_engine) -> None:
    engine = make_engine(kv_cache_tokens=80)
    requests = [
        req(prompt(10, 100 + 40 * i), max_new_tokens=40, ignore_eos=True, seed=i) for i in range(4)
    ]
    outs = await asyncio.gather(*(engine.generate(r) for r in requests))
    assert engine.stats().preemptions_total > 0
    for request, out in zip(requests, outs, strict=True):
        assert len(out.output_ids) == 40
        expected = reference_logprobs(engine.model, request.input_ids, out.output_ids, 1.0)
        torch.testing.assert_close(torch.tensor(out.output_logprobs), expected)
    assert engine.stats().kv_used_tokens == 0


async def test_in_process_weight_update_changes_outputs_and_version(make_engine) -> None:
    engine = make_engine()
    r = req(prompt(6), max_new_tokens=8, temperature=0.0, ignore_eos=True)
    before = await engine.generate(r)
    assert before.weight_version == 0
    g = torch.Generator().manual_seed(5)
    new = [
        (n, p.detach() + 0.05 * torch.randn(p.shape, generator=g))
        for n, p in engine.model.named_parameters()
    ]
    await engine.update_weights(new, weight_version=7)
    after = await engine.generate(r.model_copy(update={"rid": "after"}))
    assert after.weight_version == 7
    assert after.output_ids != before.output_ids
    expected = reference_logprobs(engine.model, r.input_ids, after.output_ids, 1.0)
    torch.testing.assert_close(torch.tensor(after.output_logprobs), expected)


async def test_disk_weight_update_and_rejected_updates(make_engine, tmp_path, tiny) -> None:
    engine = make_engine()
    model, _ = tiny
    shifted = type(model)(model.config)
    shifted.load_state_dict(model.state_dict())
    with torch.no_grad():
        shifted.lm_head.weight.mul_(-1)
    shifted.save_pretrained(tmp_path / "v3")
    r = req(prompt(6), max_new_tokens=6, temperature=0.0, ignore_eos=True)
    before = await engine.generate(r)
    await engine.update_weights_from_disk(str(tmp_path / "v3"), 3)
    after = await engine.generate(r.model_copy(update={"rid": "after"}))
    assert after.weight_version == 3 and after.output_ids != before.output_ids

    bad = [("model.norm.weight", torch.ones(3))]
    with pytest.raises(WeightLoadError, match="shape"):
        await engine.update_weights(bad, weight_version=4)
    with pytest.raises(WeightLoadError, match="missing weights"):
        await engine.update_weights([("model.norm.weight", torch.ones(64))], weight_version=4)
    with pytest.raises(WeightLoadError, match="no .safetensors"):
        await engine.update_weights_from_disk(str(tmp_path), 4)
    again = await engine.generate(r.model_copy(update={"rid": "again"}))
    assert again.weight_version == 3 and again.output_ids == after.output_ids


async def test_out_of_vocabulary_ids_in_prompt_and_output(make_engine) -> None:
    engine = make_engine()
    vocab = len(engine.tokenizer)
    assert engine.embedding_size > vocab
    out = await engine.generate(req([vocab + 5, 100, vocab + 120], max_new_tokens=4))
    assert len(out.output_ids) == 4
    # Make the padded rows win: every sampled id is now outside the tokenizer.
    oov = list(range(vocab, engine.embedding_size))
    await engine.update_weights(forcing_weights(engine, oov), weight_version=1)
    plain = await engine.generate(req(prompt(5), max_new_tokens=6, ignore_eos=True))
    assert all(i >= vocab for i in plain.output_ids) and plain.text == ""
    chunks = [c async for c in engine.generate_stream(req(prompt(5), max_new_tokens=6))]
    assert all(i >= vocab for c in chunks for i in c.output_ids)
    assert "".join(c.text for c in chunks) == ""
    assert await engine.health_generate()


@pytest.mark.parametrize(
    ("ids", "sampling", "field"),
    [
        ([1, 2, 10**9], {}, "input_ids"),
        ([-1], {}, "input_ids"),
        (list(range(100, 2148)), {}, "input_ids"),
        ([1, 2], {"max_new_tokens": 5000}, "sampling_params.max_new_tokens"),
    ],
)
async def test_bad_requests_name_the_field(make_engine, ids, sampling, field) -> None:
    engine = make_engine()
    with pytest.raises(RequestError) as err:
        await engine.generate(req(ids, **sampling))
    assert err.value.field == field
    assert (await engine.generate(req([1, 2], max_new_tokens=2))).finish_reason is not None


def test_wire_validation_names_the_field() -> None:
    cases = [
        ({}, "input_ids"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": ["a"]}, "input_ids.0"),
        (
            {"input_ids": [1], "sampling_params": {"max_new_tokens": -3}},
            "sampling_params.max_new_tokens",
        ),
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
        ([1, 2], "body"),
    ]
    for body, field in cases:
        with pytest.raises(RequestError) as err:
            GenerateRequest.from_wire(body)
        assert err.value.field == field, body
