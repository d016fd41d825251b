"""Prometheus text for an engine's `/metrics`, with vLLM's metric names.

Every engine tracerl serves (embedded, simulated) exposes the names vLLM does, so one collector
reads them all. The embedded engine accounts KV in single tokens, so its `block_size` is 1 and
`num_gpu_blocks` equals the token budget. Written with `prometheus_client` (escaping and
number formats are its own).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from tracerl.engine.types import EngineStats


class _Snapshot(Collector):
    def __init__(self, stats: EngineStats, model_name: str) -> None:
        self.stats, self.model_name = stats, model_name

    def collect(self) -> Iterator[Metric]:
        s, model = self.stats, self.model_name

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([model], value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["model_name"])  # renders NAME_total
            family.add_metric([model], value)
            return family

        usage = s.kv_used_tokens / s.kv_capacity_tokens if s.kv_capacity_tokens else 0.0
        yield gauge("vllm:num_requests_running", "Requests in the running batch.", s.running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting for admission.", s.waiting)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Waiting requests by reason (capacity: refused by admission).",
            labels=["model_name", "reason"],
        )
        by_reason.add_metric([model, "capacity"], s.waiting_for_capacity)
        by_reason.add_metric([model, "deferred"], s.waiting - s.waiting_for_capacity)
        yield by_reason
        yield gauge("vllm:kv_cache_usage_perc", "KV cache usage, 1 is full.", usage)
        yield counter("vllm:num_preemptions", "Preempted requests.", s.preemptions_total)
        yield counter("vllm:prompt_tokens", "Prefilled prompt tokens.", s.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Generated tokens.", s.generation_tokens_total)
        yield counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            s.prefix_cache_queries_total,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache.",
            s.prefix_cache_hits_total,
        )
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "KV cache configuration.",
            labels=["model_name", "block_size", "num_gpu_blocks", "kv_cache_size_tokens"],
        )
        blocks = s.kv_capacity_tokens // max(s.block_size, 1)
        cache.add_metric([model, str(s.block_size), str(blocks), str(s.kv_capacity_tokens)], 1)
        yield cache
        yield gauge("tracerl:weight_version", "Version of the served weights.", s.weight_version)
        yield gauge("tracerl:paused", "1 while generation is paused.", int(s.paused))
        if s.finished_total:
            finished = CounterMetricFamily(
                "vllm:request_success",
                "Finished requests by reason.",
                labels=["model_name", "finished_reason"],
            )
            for reason, count in sorted(s.finished_total.items()):
                finished.add_metric([model, reason], count)
            yield finished


def render_metrics(stats: EngineStats, model_name: str) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(stats, model_name))
    return generate_latest(registry).decode()
