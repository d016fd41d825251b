"""Prometheus text for an engine's `/metrics`, with vLLM's metric names.

Every engine (embedded, simulated, vLLM) exposes the same names, so one collector reads them all.
The embedded engine accounts KV in single tokens, so its `block_size` is 1 and `num_gpu_blocks`
equals the token budget.
"""

from __future__ import annotations

from tracerl.engine.types import EngineStats


def _labels(**labels: object) -> str:
    inner = ",".join(f'{k}="{str(v).replace(chr(34), chr(39))}"' for k, v in labels.items())
    return "{" + inner + "}"


def render_metrics(stats: EngineStats, model_name: str) -> str:
    m = _labels(model_name=model_name)
    usage = stats.kv_used_tokens / stats.kv_capacity_tokens if stats.kv_capacity_tokens else 0.0
    blocks = stats.kv_capacity_tokens // max(stats.block_size, 1)
    cache = _labels(
        model_name=model_name,
        block_size=stats.block_size,
        num_gpu_blocks=blocks,
        kv_cache_size_tokens=stats.kv_capacity_tokens,
    )
    rows = [
        ("vllm:num_requests_running", "gauge", "Requests in the running batch.", m, stats.running),
        ("vllm:num_requests_waiting", "gauge", "Requests waiting for admission.", m, stats.waiting),
        (
            "vllm:num_requests_waiting_by_reason",
            "gauge",
            "Waiting requests by reason (capacity: refused by admission).",
            _labels(model_name=model_name, reason="capacity"),
            stats.waiting_for_capacity,
        ),
        (
            "vllm:num_requests_waiting_by_reason",
            "gauge",
            "Waiting requests by reason (capacity: refused by admission).",
            _labels(model_name=model_name, reason="deferred"),
            stats.waiting - stats.waiting_for_capacity,
        ),
        ("vllm:kv_cache_usage_perc", "gauge", "KV cache usage, 1 is full.", m, usage),
        (
            "vllm:num_preemptions_total",
            "counter",
            "Preempted requests.",
            m,
            stats.preemptions_total,
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Prefilled prompt tokens.",
            m,
            stats.prompt_tokens_total,
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Generated tokens.",
            m,
            stats.generation_tokens_total,
        ),
        ("vllm:cache_config_info", "gauge", "KV cache configuration.", cache, 1),
        (
            "tracerl:weight_version",
            "gauge",
            "Version of the served weights.",
            m,
            stats.weight_version,
        ),
        ("tracerl:paused", "gauge", "1 while generation is paused.", m, int(stats.paused)),
    ]
    lines = []
    previous = None
    for name, kind, help_text, labels, value in rows:
        if name != previous:  # one HELP/TYPE per metric, however many labelled samples
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
        previous = name
        lines.append(f"{name}{labels} {float(value)!r}")
    if stats.finished_total:
        lines.append("# HELP vllm:request_success_total Finished requests by reason.")
        lines.append("# TYPE vllm:request_success_total counter")
    for reason, count in sorted(stats.finished_total.items()):
        lines.append(
            f"vllm:request_success_total{_labels(model_name=model_name, finished_reason=reason)}"
            f" {float(count)!r}"
        )
    return "\n".join(lines) + "\n"
