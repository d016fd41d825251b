"""The pool's `engine.generate` spans: one per generation request, across all its attempts.

A child of the gateway request's span (`GenerateRequest.traceparent`, in process only). It
says which engine served the request (`tracerl.engine.id`, the last one tried), how many
attempts it took and on which engines earlier ones failed, how many weight-sync aborts it was
resumed across, its tokens and finish reason, and fails with the pool's error when no engine
could complete it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable

from tracerl.engine.types import GenerateOutput, GenerateRequest
from tracerl.telemetry import Span, Telemetry, describe

Attempts = Callable[[GenerateRequest, Span], AsyncGenerator[GenerateOutput, None]]
"""The pool's generation, given the span it reports attempts on."""


async def traced_generation(
    telemetry: Telemetry, request: GenerateRequest, generate: Attempts
) -> AsyncGenerator[GenerateOutput, None]:
    """`generate(request, span)`'s chunks, inside the request's `engine.generate` span."""
    span = telemetry.span(
        "engine.generate",
        parent=request.traceparent,
        kind="client",
        attributes={"tracerl.engine.rid": request.rid},
    )
    try:
        async with contextlib.aclosing(generate(request, span)) as chunks:
            async for chunk in chunks:
                if chunk.finish_reason is not None:
                    span.update(
                        {
                            "gen_ai.usage.input_tokens": chunk.prompt_tokens,
                            "gen_ai.usage.output_tokens": chunk.completion_tokens,
                            "tracerl.engine.finish_reason": chunk.finish_reason,
                            "tracerl.weight_version": chunk.weight_version,
                        }
                    )
                yield chunk
    except GeneratorExit:  # the caller stopped reading (a stop string matched): not a failure
        span.set("tracerl.engine.closed_by_caller", True)
        raise
    except BaseException as e:  # a cancelled request is marked too: it never finished
        span.fail(describe(e))
        raise
    finally:
        span.end()
