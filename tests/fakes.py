"""Fakes at the engine boundary: a small aiohttp app speaking the engine wire protocol.

By default it answers every `/generate` with the next scripted completion text, tokenized with the
real tokenizer, every token at log-probability -0.5, finishing with `<|im_end|>`. Tests can
instead queue a raw behaviour for the next request (a malformed body, an error status, a stream
that ends without `[DONE]`) to drive each fail-closed path.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

LOGPROB = -0.5


@dataclass
class Raw:
    """Reply to the next request with exactly this (JSON-encoded unless `text` is set)."""

    status: int = 200
    body: Any = None
    text: str | None = None
    stream_events: list[Any] | None = None
    done: bool = True


@dataclass
class FakeEngine:
    tokenizer: Any
    eos_id: int
    texts: deque[str] = field(default_factory=deque)
    raws: deque[Raw] = field(default_factory=deque)
    requests: list[dict[str, Any]] = field(default_factory=list)
    weight_version: int = 0
    hold: asyncio.Event | None = None
    """When set, every `/generate` waits for it before answering."""
    stops: frozenset[int] = frozenset()
    """Other end-of-turn tokens: a text ending with one gets no `eos_id` after it."""

    def say(self, *texts: str) -> None:
        self.texts.extend(texts)

    def reply_raw(self, raw: Raw) -> None:
        self.raws.append(raw)

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        text = self.texts.popleft() if self.texts else "ok"
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids or ids[-1] not in self.stops:
            ids.append(self.eos_id)
        limit = body.get("sampling_params", {}).get("max_new_tokens")
        finish = "stop"
        if limit is not None and len(ids) > limit:
            ids, finish = ids[:limit], "length"
        return {
            "text": text,
            "output_ids": ids,
            "meta_info": {
                "id": body.get("rid", ""),
                "finish_reason": {"type": finish},
                "prompt_tokens": len(body["input_ids"]),
                "completion_tokens": len(ids),
                "output_token_logprobs": [[LOGPROB, i, None] for i in ids],
                "weight_version": self.weight_version,
            },
        }

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.hold is not None:
            await self.hold.wait()
        raw = self.raws.popleft() if self.raws else None
        if raw is not None and raw.stream_events is None:
            if raw.text is not None:
                return web.Response(status=raw.status, text=raw.text)
            return web.json_response(raw.body, status=raw.status)
        if not body.get("stream"):
            return web.json_response(self._completion(body))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if raw is not None:
            events = raw.stream_events or []
            done = raw.done
        else:
            full = self._completion(body)
            events, done = _split(full), True
        for event in events:
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        if done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"eos_token_ids": [self.eos_id], "weight_version": 0})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/get_model_info", self.model_info)
        return app


def _split(full: dict[str, Any]) -> list[dict[str, Any]]:
    """One stream chunk per token, the last carrying the finish reason."""
    meta = full["meta_info"]
    chunks = []
    pairs = meta["output_token_logprobs"]
    for k, pair in enumerate(pairs):
        last = k == len(pairs) - 1
        chunks.append(
            {
                "text": "",
                "output_ids": [pair[1]],
                "meta_info": {
                    **meta,
                    "output_token_logprobs": [pair],
                    "finish_reason": meta["finish_reason"] if last else None,
                },
            }
        )
    return chunks


def two_turn_loss_mask(t0: dict[str, Any], t1: dict[str, Any]) -> list[int]:
    """The loss mask of one trajectory whose second turn's prompt extends the first turn:
    1 exactly on each turn's sampled tokens, 0 on prompts and on what came between."""
    between = len(t1["prompt_ids"]) - len(t0["prompt_ids"]) - len(t0["completion_ids"])
    return (
        [0] * len(t0["prompt_ids"])
        + [1] * len(t0["completion_ids"])
        + [0] * between
        + [1] * len(t1["completion_ids"])
    )


def sampled_only(trace: dict[str, Any]) -> dict[str, Any]:
    """Assert a recorded session is one trajectory whose loss mask is 1 exactly on its turns'
    sampled tokens, in order (prompts, tool results and an environment's words are context,
    never trained on); the trajectory."""
    (trajectory,) = trace["trajectories"]
    sampled = [i for t in trace["turns"] for i in t["completion_ids"]]
    masked = zip(trajectory["token_ids"], trajectory["loss_mask"], strict=True)
    assert [i for i, m in masked if m] == sampled
    return trajectory


def shown_between(turns: list[dict[str, Any]], tokenizer: Any) -> list[str]:
    """What each turn's next turn was shown after it (a tool's answer, a game's reply, the
    template's tokens around them): the next prompt's text past this turn's completion."""
    return [
        tokenizer.decode(later["prompt_ids"][len(t["prompt_ids"]) + len(t["completion_ids"]) :])
        for t, later in itertools.pairwise(turns)
    ]
