"""The engine-metrics collector: polls every engine's `/metrics` (vLLM's names, or SGLang's
`sglang:*`) and hands the controller one `EngineLoad` per engine per poll.

The text is parsed with `prometheus_client`'s parser (escaped label values, `NaN`, `+Inf`,
histograms). Where a quantity has both names, vLLM's is read first:

| quantity | vLLM | SGLang |
| --- | --- | --- |
| running | `vllm:num_requests_running` | `sglang:num_running_reqs` |
| queued | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` |
| KV usage (0-1) | `vllm:kv_cache_usage_perc` | `sglang:token_usage` |
| KV capacity (tokens) | `vllm:cache_config_info` labels | `sglang:max_total_num_tokens` |
| preemptions | `vllm:num_preemptions_total` | `sglang:num_retracted_requests_total` |
| generated tokens | `vllm:generation_tokens_total` | `sglang:generation_tokens_total` |

Counters become per-poll deltas (no delta on an engine's first poll). Requests waiting for
capacity are `vllm:num_requests_waiting_by_reason{reason="capacity"}` where the engine reports
it (requests that just arrived, or wait out a pause, are not overload), else every waiting one;
`tracerl:paused` marks a paused engine. KV capacity comes from
`vllm:cache_config_info{kv_cache_size_tokens=...}`, with `num_gpu_blocks x block_size` as the
fallback, or SGLang's gauge; an engine with neither reports 0 (unknown: the controller does not
budget against it). The max model length is read once from `model_info()`. A failing, slow or
unparseable poll of one engine is skipped, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tracerl.control.controller import EngineLoad

log = logging.getLogger(__name__)

Mark = tuple[int, float]  # (generated tokens, poll time)

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_prometheus(text: str) -> Samples:
    """`sample name -> [(labels, value)]` from Prometheus text (a counter's samples keep their
    `_total` suffix); `ValueError` if the text is not Prometheus text."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def _total(metrics: Samples, *names: str) -> float:
    """The sum of the first of `names` the engine reports (vLLM's, then SGLang's)."""
    for name in names:
        if name in metrics:
            return sum(v for _, v in metrics[name] if v == v)  # NaN: no value
    return 0.0


def capacity_tokens(metrics: Samples) -> int:
    for labels, _ in metrics.get("vllm:cache_config_info", []):
        if labels.get("kv_cache_size_tokens") not in (None, "", "None"):
            return int(float(labels["kv_cache_size_tokens"]))
        if labels.get("num_gpu_blocks") not in (None, "", "None") and labels.get("block_size"):
            return int(float(labels["num_gpu_blocks"])) * int(float(labels["block_size"]))
    return int(_total(metrics, "sglang:max_total_num_tokens"))


class MetricsCollector:
    def __init__(
        self,
        engines: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        on_sample: Callable[[list[EngineLoad], float], Any],
        *,
        roles: dict[str, str] | None = None,
        interval_s: float = 5.0,
        timeout_s: float = 3.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """`engines` maps a name to anything with `metrics_text()` and `model_info()` coroutines
        (an `EngineClient`, or an engine object in this process), or is a function returning
        that map at each poll (`EnginePool.engines`: a restarted engine has a new client)."""
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
        engines = self.engines() if callable(self.engines) else self.engines
        results = await asyncio.gather(*(self._poll(n, e) for n, e in engines.items()))
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
            m = parse_prometheus(text)
        except Exception as e:  # one engine's failure never stops the others' polls
            self.failed_polls += 1
            log.debug("metrics poll of %s skipped: %r", name, e)
            return None
        counters = {
            "preemptions": _total(
                m, "vllm:num_preemptions_total", "sglang:num_retracted_requests_total"
            ),
            "generated": _total(
                m, "vllm:generation_tokens_total", "sglang:generation_tokens_total"
            ),
        }
        previous = self._previous.get(name)
        self._previous[name] = counters
        delta = {
            k: 0.0 if previous is None else max(0.0, v - previous.get(k, v))
            for k, v in counters.items()
        }  # a restarted engine's counters start again from 0: no negative delta
        preempted = delta["preemptions"]
        self.generated_tokens += int(delta["generated"])
        waiting = int(_total(m, "vllm:num_requests_waiting", "sglang:num_queue_reqs"))
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
            kv_usage=_total(m, "vllm:kv_cache_usage_perc", "sglang:token_usage"),
            running=int(_total(m, "vllm:num_requests_running", "sglang:num_running_reqs")),
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
