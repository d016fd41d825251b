"""Prometheus text in and out: vLLM's and SGLang's metric names, and what the parser handles."""

from __future__ import annotations

from typing import Any

import pytest

from tracerl.control.collector import MetricsCollector, capacity_tokens, parse_prometheus
from tracerl.engine.metrics import render_metrics
from tracerl.engine.types import EngineStats

# What an SGLang 0.5.x server's /metrics carries (names and labels from its metrics collector)
SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0"} 3.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0"} 0.42
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="m",tp_rank="0",pp_rank="0"} 50000.0
# HELP sglang:num_retracted_requests_total Retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{engine_type="unified",model_name="m",tp_rank="0"} {retracted}
# HELP sglang:generation_tokens_total Generated tokens.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="m"} {generated}
"""


class _Text:
    def __init__(self, text: str) -> None:
        self.text = text

    async def metrics_text(self) -> str:
        return self.text

    async def model_info(self) -> dict[str, Any]:
        return {"max_model_len": 2048}


def sglang(retracted: float, generated: float) -> str:
    return SGLANG.replace("{retracted}", str(retracted)).replace("{generated}", str(generated))


async def test_the_collector_reads_sglang_metrics() -> None:
    engine = _Text(sglang(1, 100))
    seen: list[Any] = []
    collector = MetricsCollector({"sglang": engine}, lambda s, now: seen.append(s))
    [first] = await collector.poll_once()
    assert (first.running, first.waiting, first.waiting_for_capacity) == (7, 3, 3)
    assert first.kv_usage == pytest.approx(0.42)
    assert first.capacity_tokens == 50000 and first.max_model_len == 2048
    engine.text = sglang(4, 160)
    [second] = await collector.poll_once()
    assert second.preemptions == 3  # retractions since the last poll
    assert collector.generated_tokens == 60


def test_the_parser_handles_escapes_nan_inf_and_histograms() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a \\"quoted\\" \\\\ name"} 2\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="m"} NaN\n'
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="0.5"} 3\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 4\n'
        "vllm:e2e_request_latency_seconds_sum 1.5\n"
        "vllm:e2e_request_latency_seconds_count 4\n"
    )
    m = parse_prometheus(text)
    [(labels, value)] = m["vllm:num_requests_running"]
    assert labels["model_name"] == 'a "quoted" \\ name' and value == 2.0
    assert m["vllm:kv_cache_usage_perc"][0][1] != m["vllm:kv_cache_usage_perc"][0][1]  # NaN
    assert [v for _, v in m["vllm:e2e_request_latency_seconds_bucket"]] == [3.0, 4.0]
    with pytest.raises(ValueError):
        parse_prometheus("vllm:num_requests_running{model_name=unquoted} 1\n")


async def test_an_unparseable_poll_is_skipped_not_fatal() -> None:
    collector = MetricsCollector({"bad": _Text("not {prometheus 1\n")}, lambda s, now: None)
    assert await collector.poll_once() == [] and collector.failed_polls == 1


def test_rendered_metrics_round_trip_through_the_parser() -> None:
    stats = EngineStats(
        running=3, waiting=5, waiting_for_capacity=2, kv_used_tokens=40, kv_capacity_tokens=100,
        preemptions_total=7, generation_tokens_total=11, finished_total={"stop": 4},
        weight_version=9, paused=True,
    )  # fmt: skip
    m = parse_prometheus(render_metrics(stats, 'model "x"'))
    assert m["vllm:num_requests_running"] == [({"model_name": 'model "x"'}, 3.0)]
    assert m["vllm:num_preemptions_total"][0][1] == 7.0  # counters keep the _total name
    assert m["vllm:generation_tokens_total"][0][1] == 11.0
    assert m["vllm:kv_cache_usage_perc"][0][1] == pytest.approx(0.4)
    assert capacity_tokens(m) == 100
    reasons = {labels["reason"]: v for labels, v in m["vllm:num_requests_waiting_by_reason"]}
    assert reasons == {"capacity": 2.0, "deferred": 3.0}
    assert m["tracerl:paused"][0][1] == 1.0 and m["tracerl:weight_version"][0][1] == 9.0
    assert m["vllm:request_success_total"] == [
        ({"model_name": 'model "x"', "finished_reason": "stop"}, 4.0)
    ]


def test_no_capacity_metric_reads_as_unknown() -> None:
    assert capacity_tokens(parse_prometheus(sglang(0, 0).split("# HELP sglang:max")[0])) == 0
    vllm_none = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    assert capacity_tokens(parse_prometheus(vllm_none)) == 0
