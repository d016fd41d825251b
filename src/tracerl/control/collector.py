"""The engine-metrics collector: polls every engine's `/metrics` (vLLM names) and hands the
controller one `EngineLoad` per engine per poll.

Counters become per-poll deltas (no delta on an engine's first poll). Requests waiting for
capacity are `vllm:num_requests_waiting_by_reason{reason="capacity"}` where the engine reports
it (requests that just arrived, or wait out a pause, are not overload), else every waiting one;
`tracerl:paused` marks a paused engine. KV capacity comes from
`vllm:cache_config_info{kv_cache_size_tokens=...}`, with `num_gpu_blocks x block_size` as the
fallback; the max model length is read once from `/get_model_info`. A failing or slow poll of
one engine is skipped, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from tracerl.control.controller import EngineLoad

log = logging.getLogger(__name__)

Mark = tuple[int, float]  # (generated tokens, poll time)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """`name -> [(labels, value)]` from Prometheus text format (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(3) or ""))
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        out.setdefault(match.group(1), []).append((labels, value))
    return out


def _total(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(v for _, v in metrics.get(name, []))


def capacity_tokens(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> int:
    for labels, _ in metrics.get("vllm:cache_config_info", []):
        if labels.get("kv_cache_size_tokens"):
            return int(float(labels["kv_cache_size_tokens"]))
        if labels.get("num_gpu_blocks") and labels.get("block_size"):
            return int(float(labels["num_gpu_blocks"])) * int(float(labels["block_size"]))
    return 0


class MetricsCollector:
    def __init__(
        self,
        engines: dict[str, Any],
        on_sample: Callable[[list[EngineLoad], float], Any],
        *,
        roles: dict[str, str] | None = None,
        interval_s: float = 5.0,
        timeout_s: float = 3.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """`engines` maps a name to anything with `metrics_text()` and `model_info()` coroutines
        (an `EngineClient`, or an engine object in this process)."""
        self.engines = engines
        self.on_sample = on_sample
        self.roles = roles or {}
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.clock = clock or (lambda: asyncio.get_running_loop().time())
        self._previous: dict[str, dict[str, float]] = {}
        self._max_len: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self.failed_polls = 0
        self.generated_tokens = 0
        """Tokens the engines generated since this collector's first poll of each."""
        self.polled_at: float | None = None
        """When the last poll with at least one answer ended (the collector's clock)."""

    def generation_rate(self, since: Mark | None) -> tuple[float | None, Mark | None]:
        """The engines' generation rate (tokens/s) between the mark `since` and the last poll,
        and the new mark: `(None, since)` until a poll has come after `since`."""
        if self.polled_at is None:
            return None, since
        mark = (self.generated_tokens, self.polled_at)
        if since is None or self.polled_at <= since[1]:
            return None, since if since is not None else mark
        return (mark[0] - since[0]) / (mark[1] - since[1]), mark

    async def poll_once(self) -> list[EngineLoad]:
        results = await asyncio.gather(*(self._poll(n, e) for n, e in self.engines.items()))
        samples = [s for s in results if s is not None]
        if samples:
            self.polled_at = self.clock()
            outcome = self.on_sample(samples, self.polled_at)
            if isinstance(outcome, Awaitable):
                await outcome
        return samples

    async def _poll(self, name: str, engine: Any) -> EngineLoad | None:
        try:
            if name not in self._max_len:
                async with asyncio.timeout(self.timeout_s):
                    info = await engine.model_info()
                self._max_len[name] = int(info.get("max_model_len", 0))
            async with asyncio.timeout(self.timeout_s):
                text = await engine.metrics_text()
        except Exception as e:  # one engine's failure never stops the others' polls
            self.failed_polls += 1
            log.debug("metrics poll of %s skipped: %r", name, e)
            return None
        m = parse_prometheus(text)
        counters = {
            "preemptions": _total(m, "vllm:num_preemptions_total"),
            "generated": _total(m, "vllm:generation_tokens_total"),
        }
        previous = self._previous.get(name)
        self._previous[name] = counters
        delta = {
            k: 0.0 if previous is None else max(0.0, v - previous.get(k, v))
            for k, v in counters.items()
        }  # a restarted engine's counters start again from 0: no negative delta
        preempted = delta["preemptions"]
        self.generated_tokens += int(delta["generated"])
        waiting = int(_total(m, "vllm:num_requests_waiting"))
        by_reason = m.get("vllm:num_requests_waiting_by_reason")
        if by_reason is not None:  # vLLM and ours: only admission refusals are overload
            for_capacity = int(
                sum(v for labels, v in by_reason if labels.get("reason") == "capacity")
            )
        else:  # an engine without the breakdown: every waiting request counts
            for_capacity = waiting
        return EngineLoad(
            capacity_tokens=capacity_tokens(m),
            max_model_len=self._max_len[name],
            kv_usage=_total(m, "vllm:kv_cache_usage_perc"),
            running=int(_total(m, "vllm:num_requests_running")),
            waiting=waiting,
            waiting_for_capacity=for_capacity,
            preemptions=int(preempted),
            role=self.roles.get(name, "decode"),  # type: ignore[arg-type]
            paused=_total(m, "tracerl:paused") > 0,
        )

    async def _loop(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
