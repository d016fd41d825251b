"""The SGLang client against a fake that speaks SGLang's own routes, shapes and metric names
(0.5.14 and later, launched with `--incremental-streaming-output --enable-metrics`): what the
pool and the collector need from a real SGLang server, short of one (that runs on a GPU)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from tests.waiting import wait_until
from tracerl.config import EngineConfig, PoolConfig
from tracerl.control.collector import MetricsCollector
from tracerl.engine.adapters import AdapterFiles
from tracerl.engine.server import start_server
from tracerl.engine.sglang import SGLangClient
from tracerl.engine.types import GenerateRequest, WeightLoadError
from tracerl.rollout.backends import client_for
from tracerl.rollout.pool import EnginePool, Member

MOE = (2, 2, 8)  # the fake's routing: 2 layers, top-2 of 8 experts


def expert_ids(position: int) -> np.ndarray:
    """What the fake's router chose at `position`, `[layers, top_k]`."""
    return (position * 7 + np.arange(4).reshape(2, 2) * 3) % MOE[2]


SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids",
                 "ignore_eos", "sampling_seed", "json_schema"}  # fmt: skip


@dataclass
class FakeSGLang:
    version: str = "0"
    paused: bool = False
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    live: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    running: int = 0
    generated: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    adapters: dict[str, str] = field(default_factory=dict)
    """Loaded LoRA adapters: served name -> path (`/load_lora_adapter`)."""

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        params = body.get("sampling_params", {})
        unknown = set(params) - SAMPLING_KEYS
        if unknown:  # SGLang's API contract rejects unknown sampling keys
            return web.json_response({"error": f"unknown keys {sorted(unknown)}"}, status=400)
        rid, n = body["rid"], params.get("max_new_tokens", 128)
        adapter = body.get("lora_path")
        if adapter is not None and adapter not in self.adapters:
            return web.json_response({"error": f"LoRA adapter {adapter} is not loaded"}, 400)
        shift = 1000 * int(adapter.rpartition("-v")[2]) if adapter else 0  # which one sampled
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.running += 1
        self.live.add(rid)
        spans: list[dict[str, Any]] = []
        try:
            for k in range(n):
                while self.paused:
                    self.resumed.clear()
                    await self.resumed.wait()
                if rid in self.aborted:
                    finish: dict[str, Any] = {"type": "abort", "message": "Aborted"}
                    await self._send(resp, rid, [], finish, k, spans, body)
                    break
                token = 100 + (params.get("sampling_seed") or 0) + k + shift
                if spans and spans[-1]["version"] == self.version:
                    spans[-1]["end"] = k + 1
                else:
                    spans.append({"version": self.version, "start": k, "end": k + 1})
                last = k == n - 1
                finish = {"type": "length", "length": n} if last else None
                self.generated += 1
                await self._send(resp, rid, [token], finish, k + 1, spans if last else None, body)
                await asyncio.sleep(0.002)  # the fake's decode step
        finally:
            self.running -= 1
            self.live.discard(rid)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _send(
        self, resp: web.StreamResponse, rid: str, ids: list[int], finish: Any, done: int,
        spans: list[dict[str, Any]] | None, body: dict[str, Any],
    ) -> None:  # fmt: skip
        prompt = len(body["input_ids"])
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": finish, "prompt_tokens": prompt,
            "completion_tokens": done, "output_token_logprobs": [[-0.25, i, None] for i in ids],
            "weight_version": self.version, "cached_tokens": 0,
        }  # fmt: skip
        if spans is not None:
            meta["weight_versions"] = spans
        if finish is not None and body.get("return_routed_experts"):  # SGLang's raw int32 rows
            rows = np.stack([expert_ids(p) for p in range(prompt + done - 1)]).astype(np.int32)
            meta["routed_experts"] = base64.b64encode(rows.tobytes()).decode()
        event = {"text": "", "output_ids": ids, "meta_info": meta}
        await resp.write(f"data: {json.dumps(event)}\n\n".encode())

    async def abort(self, request: web.Request) -> web.Response:
        body = await request.json()
        prefix = "" if body.get("abort_all") else body["rid"]
        self.aborted |= {r for r in self.live if r.startswith(prefix)}  # SGLang: by prefix
        return web.Response(status=200)  # SGLang answers with an empty body

    async def pause(self, request: web.Request) -> web.Response:
        assert (await request.json())["mode"] in ("abort", "retract", "in_place")
        self.paused = True
        return web.json_response({})

    async def resume(self, request: web.Request) -> web.Response:
        self.paused = False
        self.resumed.set()
        return web.json_response({})

    async def update(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not body["model_path"].startswith("/good"):
            return web.json_response(
                {"success": False, "message": "Failed to load weights", "num_paused_requests": 0},
                status=400,
            )
        self.version = body["weight_version"]
        return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})

    async def load_lora(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body["lora_name"], body["lora_path"]
        if name in self.adapters:  # SGLang refuses a name it serves
            return web.json_response(
                {"success": False, "error_message": f"{name} is already loaded"}, status=400
            )
        if not path.startswith("/good"):
            return web.json_response(
                {"success": False, "error_message": f"cannot read {path}"}, status=400
            )
        self.adapters[name] = path
        return web.json_response({"success": True, "loaded_adapters": self.adapters})

    async def unload_lora(self, request: web.Request) -> web.Response:
        self.adapters.pop((await request.json())["lora_name"])
        return web.json_response({"success": True, "loaded_adapters": self.adapters})

    async def set_version(self, request: web.Request) -> web.Response:
        self.version = (await request.json())["new_version"]
        return web.json_response({"success": True, "message": "ok"})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"model_path": "m", "is_generation": True, "weight_version": self.version}
        )

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"max_total_num_tokens": 50000, "context_length": None})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        labels = 'engine_type="unified",model_name="m",tp_rank="0",pp_rank="0"'
        rows = [
            ("sglang:num_running_reqs", "gauge", self.running),
            ("sglang:num_queue_reqs", "gauge", 0),
            ("sglang:token_usage", "gauge", 0.25),
            ("sglang:max_total_num_tokens", "gauge", 50000),
            ("sglang:num_retracted_requests_total", "counter", 0),
            ("sglang:generation_tokens_total", "counter", self.generated),
        ]
        text = "".join(
            f"# HELP {n} {n}\n# TYPE {n} {t}\n{n}{{{labels}}} {float(v)}\n" for n, t, v in rows
        )
        return web.Response(text=text, content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application()
        for path, handler in (("/generate", self.generate), ("/abort_request", self.abort),
                              ("/pause_generation", self.pause),
                              ("/continue_generation", self.resume),
                              ("/update_weights_from_disk", self.update),
                              ("/load_lora_adapter", self.load_lora),
                              ("/unload_lora_adapter", self.unload_lora),
                              ("/update_weight_version", self.set_version)):  # fmt: skip
            app.router.add_post(path, handler)
        for path, handler in (("/model_info", self.model_info), ("/server_info", self.server_info),
                              ("/v1/models", self.models), ("/health", self.health),
                              ("/health_generate", self.health),
                              ("/metrics", self.metrics)):  # fmt: skip
            app.router.add_get(path, handler)
        return app


@pytest.fixture
async def sglang() -> AsyncIterator[tuple[list[FakeSGLang], EnginePool]]:
    fakes = [FakeSGLang(), FakeSGLang()]
    runners, members = [], []
    config = EngineConfig(backend="sglang")
    for i, fake in enumerate(fakes):
        runner, port = await start_server(fake.app(), "127.0.0.1", 0)
        runners.append(runner)
        client = client_for(config, f"http://127.0.0.1:{port}", 30)
        assert isinstance(client, SGLangClient)
        members.append(Member(f"sglang{i}", client))
    pool = EnginePool(members, PoolConfig(failure_threshold=2, health_interval_s=0.2))
    await pool.start()
    yield fakes, pool
    await pool.close()
    for runner in runners:
        await runner.cleanup()


async def streaming(pool: EnginePool, req: GenerateRequest) -> tuple[asyncio.Task[None], list[Any]]:
    """`req` streaming through `pool` in a task, once its first 5 chunks have arrived: the task
    and the list its chunks go on arriving in."""
    chunks: list[Any] = []

    async def run() -> None:
        async for chunk in pool.generate_stream(req):
            chunks.append(chunk)

    task = asyncio.create_task(run())
    await wait_until(lambda: len(chunks) >= 5, "5 chunks")
    return task, chunks


def request(rid: str, n: int, seed: int | None = None) -> GenerateRequest:
    return GenerateRequest(
        rid=rid, input_ids=[1, 2, 3], sampling_params={"max_new_tokens": n, "seed": seed}
    )


async def test_generation_speaks_sglangs_sampling_keys(sglang) -> None:
    fakes, pool = sglang
    out = await pool.generate(request("s1-r1", 4, seed=7))
    assert out.output_ids == [107, 108, 109, 110] and out.output_logprobs == [-0.25] * 4
    assert out.finish_reason == "length" and out.weight_version == 0
    body = next(b for f in fakes for b in f.bodies)
    assert body["sampling_params"]["sampling_seed"] == 7 and "seed" not in body["sampling_params"]
    assert "top_k" not in body["sampling_params"]  # -1 is ours; SGLang's default is all tokens
    assert "json_schema" not in body["sampling_params"]  # unconstrained: no key at all
    schema = '{"type": "object"}'
    constrained = request("s1-r2", 4).model_copy(deep=True)
    constrained.sampling_params.json_schema = schema
    await pool.generate(constrained)
    body = next(b for f in fakes for b in f.bodies if b["rid"] == "s1-r2")
    assert body["sampling_params"]["json_schema"] == schema  # SGLang's own field, as is
    info = await pool.model_info()
    assert info["max_model_len"] == 4096 and info["kv_cache_tokens"] == 50000


async def test_an_abort_returns_the_partial_output_and_the_pool_resumes_it(sglang) -> None:
    _, pool = sglang
    task, chunks = await streaming(pool, request("s2-r1", 60))
    owner = next(m for m in pool.members if m.inflight)
    assert isinstance(owner.engine, SGLangClient)
    assert await owner.engine.abort("s2-r1") == 1
    await asyncio.wait_for(task, 30)
    ids = [i for c in chunks for i in c.output_ids]
    assert len(ids) == 60 and chunks[-1].finish_reason == "length"
    assert pool.counters["aborted_resumed"] == 1


async def test_a_weight_update_in_place_labels_every_token(sglang) -> None:
    fakes, pool = sglang
    task, chunks = await streaming(pool, request("s3-r1", 200))
    await pool.update_weights("/good/weights", 1)
    assert all(f.version == "1" for f in fakes)
    await asyncio.wait_for(task, 30)
    assert chunks[-1].weight_version == 1 and chunks[-1].weight_version_min == 0
    assert (await pool.model_info())["weight_version"] == 1


async def test_lora_versions_load_under_their_own_names_and_label_their_tokens(sglang) -> None:
    """Each adapter push is a new served name (SGLang refuses to reload one); requests naming
    the adapter go to its newest version; one running across a push finishes on the version it
    started on, and its tokens say so although the server's global label moved on; versions
    older than the last two are unloaded; a push SGLang cannot load is an error."""
    fakes, pool = sglang
    for version in (1, 2):
        files = AdapterFiles("run", f"/good/{version}")
        await pool.update_weights(None, version, adapter_files=files)
    out = await pool.generate(request("l1", 3))
    assert (out.adapter, out.weight_version) == ("run", 2)
    assert out.output_ids == [2100, 2101, 2102]  # sampled by version 2
    assert pool.adapter_names() == {"run"}
    task, chunks = await streaming(pool, request("l2", 200))
    await pool.update_weights(None, 3, adapter_files=AdapterFiles("run", "/good/3"))
    assert all(f.version == "3" and set(f.adapters) == {"run-v2", "run-v3"} for f in fakes)
    await asyncio.wait_for(task, 30)
    ids = [i for c in chunks for i in c.output_ids]
    assert len(ids) == 200 and all(2100 <= i < 2300 for i in ids)  # all version 2's
    assert {c.weight_version for c in chunks} == {2} and chunks[-1].weight_version_min is None
    out = await pool.generate(request("l3", 2))
    assert (out.weight_version, out.output_ids) == (3, [3100, 3101])
    client = pool.members[0].engine
    assert isinstance(client, SGLangClient)
    with pytest.raises(WeightLoadError, match="SGLang could not load adapter /bad/4: cannot"):
        await client.load_lora_adapter("run", "/bad/4", 4)
    assert client.served.newest("run") == ("run-v3", 3)  # still serving version 3
    await client.load_lora_adapter("run", "/good/3b", 3)  # again (a resumed run's push)
    fake = next(f for f in fakes if f.adapters.get("run-v3") == "/good/3b")
    assert set(fake.adapters) == {"run-v2", "run-v3"}


async def test_weights_sglang_cannot_load_take_it_out_of_rotation(sglang) -> None:
    _, pool = sglang
    await pool.update_weights("/bad/weights", 1)
    assert not any(m.active for m in pool.members)
    assert pool.counters["update_failed"] == 2


async def test_the_collector_reads_an_sglang_engine(sglang) -> None:
    _, pool = sglang
    collector = MetricsCollector(pool.engines, lambda samples, now: None)
    loads = await collector.poll_once()
    assert [x.capacity_tokens for x in loads] == [50000, 50000]
    assert all(x.kv_usage == 0.25 and x.max_model_len == 4096 for x in loads)


async def test_routed_experts_come_back_through_an_abort_as_one_record(tmp_path) -> None:
    """A MoE model's client asks for routed experts and reads SGLang's raw int32 rows with
    the layout of the model's config; an aborted and resumed request gets one record over all
    its tokens. A dense model's client does not ask."""
    model = tmp_path / "moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "num_experts_per_tok": 2, "num_experts": 8}
    ))  # fmt: skip
    fake = FakeSGLang()
    runner, port = await start_server(fake.app(), "127.0.0.1", 0)
    client = client_for(
        EngineConfig(backend="sglang", model=str(model)), f"http://127.0.0.1:{port}", 30
    )
    assert isinstance(client, SGLangClient) and client.sglang_routing == MOE
    pool = EnginePool([Member("sglang", client)])
    req = request("moe-r1", 60).model_copy(update={"return_routed_experts": True})
    try:
        task, chunks = await streaming(pool, req)
        assert await client.abort("moe-r1") == 1
        await asyncio.wait_for(task, 30)
    finally:
        await pool.close()
        await runner.cleanup()
    assert pool.counters["aborted_resumed"] == 1
    assert all(b["return_routed_experts"] for b in fake.bodies)
    record = chunks[-1].routed_experts
    assert record is not None and record.shape == (3 + 60, 2, 2) and record.dtype == np.uint8
    np.testing.assert_array_equal(record[:-1], np.stack([expert_ids(p) for p in range(62)]))
    assert (record[-1] == 255).all()
    dense = client_for(EngineConfig(backend="sglang"), "http://127.0.0.1:1", 30)
    assert isinstance(dense, SGLangClient) and dense.sglang_routing is None
    assert "return_routed_experts" not in dense._wire(req, True)
