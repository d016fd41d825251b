"""The embedded engine on CUDA (run where a GPU exists: `pytest -m gpu`)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tracerl.config import EngineConfig
from tracerl.engine.local import LocalEngine
from tracerl.engine.types import GenerateRequest

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
async def test_cuda_engine_logprobs_match_full_forward(dtype: str) -> None:
    engine = LocalEngine(EngineConfig(model="tiny", device="cuda", dtype=dtype))
    async with engine:
        requests = [
            GenerateRequest(
                input_ids=list(range(100 + 40 * i, 110 + 40 * i + 3 * i)),
                sampling_params={"max_new_tokens": 20 + 5 * i, "seed": i, "ignore_eos": True},
            )
            for i in range(4)
        ]
        outs = await asyncio.gather(*(engine.generate(r) for r in requests))
    for request, out in zip(requests, outs, strict=True):
        ids = torch.tensor([request.input_ids + out.output_ids], device="cuda")
        with torch.no_grad():
            logits = engine.model(ids).logits[0, len(request.input_ids) - 1 : -1].float()
        expected = torch.log_softmax(logits, -1).gather(
            -1, torch.tensor(out.output_ids, device="cuda")[:, None]
        )[:, 0]
        got = torch.tensor(out.output_logprobs, device="cuda")
        if dtype == "float32":
            torch.testing.assert_close(got, expected)
        else:  # bfloat16 kernels differ between batched decode and a full forward
            torch.testing.assert_close(got, expected, atol=0.1, rtol=0.05)
