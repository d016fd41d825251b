"""`sampling_params.json_schema` on the embedded engine: the random `tiny` model, which left to
itself writes no JSON, writes only values that match the schema, and its log-probs stay the
unmasked ones the trainer recomputes."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from tests.conftest import reference_logprobs
from tracerl.engine.types import GenerateRequest, RequestError

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["city", "days", "tags"],
    "additionalProperties": False,
}


def req(ids: list[int], **sampling) -> GenerateRequest:
    return GenerateRequest(input_ids=ids, sampling_params=sampling)


def check(value: dict) -> None:
    assert set(value) == {"city", "days", "tags"}
    assert value["city"] in SCHEMA["properties"]["city"]["enum"]
    assert isinstance(value["days"], int) and 1 <= value["days"] <= 9
    assert len(value["tags"]) <= 3 and all(isinstance(t, bool) for t in value["tags"])


@pytest.mark.parametrize("temperature", [1.0, 0.0])
async def test_every_output_matches_the_schema_and_ends_there(make_engine, temperature) -> None:
    engine = make_engine()
    schema = json.dumps(SCHEMA)
    requests = [
        req(
            list(range(100 + 7 * i, 110 + 7 * i)),
            max_new_tokens=120,
            temperature=temperature,
            seed=i,
            json_schema=schema,
        )
        for i in range(6)
    ]
    outs = await asyncio.gather(*(engine.generate(r) for r in requests))
    for request, out in zip(requests, outs, strict=True):
        assert out.finish_reason == "stop", engine.tokenizer.decode(out.output_ids)
        assert out.output_ids[-1] in engine.eos_ids  # the value complete, its end sampled
        check(json.loads(out.text))
        # compact JSON, as json.dumps writes it: no whitespace padding
        assert out.text == json.dumps(json.loads(out.text))
        expected = reference_logprobs(engine.model, request.input_ids, out.output_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.output_logprobs), expected)


async def test_unconstrained_rows_in_the_same_batch_are_untouched(make_engine) -> None:
    engine = make_engine()
    free = req([5, 6, 7], max_new_tokens=12, seed=3, ignore_eos=True)
    alone = await engine.generate(free)
    beside = await asyncio.gather(
        engine.generate(free.model_copy(update={"rid": "free"})),
        engine.generate(req([8, 9], max_new_tokens=40, seed=4, json_schema=json.dumps(SCHEMA))),
    )
    assert beside[0].output_ids == alone.output_ids


async def test_a_schema_that_cannot_be_compiled_is_refused_naming_the_field(make_engine) -> None:
    engine = make_engine()
    with pytest.raises(RequestError, match=r"sampling_params\.json_schema: .*nonsense"):
        await engine.generate(req([5, 6], json_schema=json.dumps({"type": "nonsense"})))
    with pytest.raises(ValueError, match="json_schema"):
        req([5, 6], json_schema="{not json")
    with pytest.raises(ValueError, match="json_schema"):
        req([5, 6], json_schema="[1, 2]")
