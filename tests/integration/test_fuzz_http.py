"""Schemathesis fuzzes the gateway (over the simulated engine) and the embedded engine (`tiny`)
through their published OpenAPI documents (`GET /openapi.json`), over real HTTP.

Every operation gets schema-valid and schema-violating requests (bodies, and for the sessions'
routes their path and keys too). Checked: no 5xx; every 4xx in the family's native error shape
(OpenAI, Anthropic, engine); a session records exactly one turn per generation answered in full
and nothing for a rejected one; the server is healthy and serving afterwards. Bounded by
`FUZZ_EXAMPLES` examples per operation and mode (override with TRACERL_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("TRACERL_FUZZ_EXAMPLES", "30"))
MODES = ("positive", "negative")


class Served:
    """An aiohttp app started by `build` on an event loop of its own thread."""

    def __init__(self, build: Callable[[], Awaitable[tuple[Any, str, dict[str, Any]]]]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner, self.url, self.extra = self.call(build())

    def call(self, coro: Awaitable[Any], timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def close(self, *closers: Callable[[], Awaitable[Any]]) -> None:
        async def stop() -> None:
            await self.runner.cleanup()
            for closer in closers:
                await closer()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def fuzz(
    doc: dict[str, Any],
    base_url: str,
    prepare: Callable[[Any, str], dict[str, Any]],
    check: Callable[[Any, requests.Response], None],
) -> Counter[str]:
    """Drive every operation of `doc` in both generation modes; `prepare(operation, mode)`
    gives fixed strategy arguments (path parameters, headers); returns status counts."""
    schema = schemathesis.openapi.from_dict(doc)
    statuses: Counter[str] = Counter()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in MODES:
            fixed = prepare(operation, mode)
            if fixed.get("skip"):
                continue
            strategy = operation.as_strategy(
                generation_mode=schemathesis.GenerationMode(mode), **fixed
            )

            @settings(
                max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck),
            )  # fmt: skip
            @given(strategy)
            def run(case: Any) -> None:
                response = case.call(base_url=base_url, session=session, timeout=60)
                statuses[f"{case.method} {case.operation.path} {response.status_code}"] += 1
                check(case, response)

            try:
                run()
            except Unsatisfiable:  # nothing in it can be made invalid (no parameters, no body)
                assert mode == "negative", f"{operation.method} {operation.path}"
    return statuses


def _json(case: Any, response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise AssertionError(
            f"{case.method} {case.formatted_path} {response.status_code}: not JSON: "
            f"{response.headers.get('Content-Type')} {response.text[:200]!r}"
        ) from None


def _native_openai(body: Any) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error


def _native_anthropic(body: Any) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return body.get("type") == "error" and isinstance(error, dict) and "message" in error


@pytest.fixture
def gateway(tiny: tuple[Any, Any], tmp_path: Path) -> Iterator[Served]:
    from tracerl.config import SimEngineConfig
    from tracerl.engine.server import start_server
    from tracerl.engine.sim import SimEngine
    from tracerl.gateway.server import Gateway
    from tracerl.gateway.store import SQLiteTraceStore

    _, tokenizer = tiny
    parts: dict[str, Any] = {}

    async def build() -> tuple[Any, str, dict[str, Any]]:
        sim = SimEngine(
            SimEngineConfig(
                time_scale=1000.0, output_len_median=8.0, output_len_sigma=0.5,
                eos_token_id=tokenizer.eos_token_id, vocab_size=len(tokenizer),
            )
        )  # fmt: skip
        store = SQLiteTraceStore(tmp_path / "fuzz.sqlite")
        info = await sim.model_info()
        gw = Gateway(sim, tokenizer, store, model_name="tiny", eos_ids=set(info["eos_token_ids"]))
        runner, port = await start_server(gw.app(), "127.0.0.1", 0, cancel_on_disconnect=False)
        parts.update(sim=sim, store=store)
        return runner, f"http://127.0.0.1:{port}", {"gateway": gw}

    served = Served(build)
    yield served
    served.close(parts["store"].close, parts["sim"].close)


def test_the_gateway_survives_its_fuzzed_surface(gateway: Served) -> None:
    url, admin = gateway.url, gateway.extra["gateway"].admin_key
    doc = requests.get(f"{url}/openapi.json", timeout=30).json()
    admin_headers = {"Authorization": f"Bearer {admin}"}

    def new_session() -> dict[str, Any]:
        r = requests.post(f"{url}/sessions", headers=admin_headers, json={}, timeout=30)
        assert r.status_code == 200, r.text
        return dict(r.json())

    traced, spare = new_session(), new_session()
    answered = Counter[str]()  # generations answered in full, per session

    def prepare(operation: Any, mode: str) -> dict[str, Any]:
        path = operation.path
        if path.startswith("/s/"):
            if mode == "negative":  # wrong sessions and keys as well as wrong bodies
                return {}
            key = traced["api_key"]
            return {
                "path_parameters": {"sid": traced["session_id"]},
                "headers": {"Authorization": f"Bearer {key}", "x-api-key": key},
            }
        if path.startswith("/sessions/"):  # closing the traced session would end its test
            return {"path_parameters": {"sid": spare["session_id"]}, "headers": admin_headers}
        return {"headers": admin_headers} if mode == "positive" else {}

    def check(case: Any, response: requests.Response) -> None:
        status = response.status_code
        assert status < 500, f"{case.method} {case.formatted_path}: {status} {response.text[:300]}"
        path = case.operation.path
        anthropic = "/v1/messages" in path
        if status >= 400:
            body = _json(case, response)
            native = _native_anthropic(body) if anthropic else _native_openai(body)
            assert native, f"{case.method} {path} {status}: not a native error: {body}"
            return
        sid = (case.path_parameters or {}).get("sid")
        generation = path.endswith(("/chat/completions", "/messages", "/responses"))
        if status == 200 and generation and path.startswith("/s/") and sid == traced["session_id"]:
            text = response.text
            if "text/event-stream" in response.headers.get("Content-Type", ""):
                ends = ("data: [DONE]", "event: message_stop", "event: response.completed",
                        "event: response.incomplete")  # fmt: skip
                ended = any(end in text for end in ends)
            else:
                ended = True
            answered[sid] += int(ended)

    statuses = fuzz(doc, url, prepare, check)
    print("gateway fuzz:", sum(statuses.values()), "requests", sorted(statuses.items()))
    assert sum(statuses.values()) >= FUZZ_EXAMPLES  # it ran
    assert any(k.endswith(" 200") for k in statuses) and any(k.endswith(" 400") for k in statuses)
    # exactly the generations answered in full were recorded, nothing for the rejected ones
    trace = requests.get(
        f"{url}/sessions/{traced['session_id']}", headers=admin_headers, timeout=30
    )
    assert trace.status_code == 200
    assert len(trace.json()["turns"]) == answered[traced["session_id"]] > 0
    # and it still serves
    assert requests.get(f"{url}/health", timeout=30).status_code == 200
    fresh = new_session()
    ok = requests.post(
        f"{fresh['openai_base_url']}/chat/completions",
        headers={"Authorization": f"Bearer {fresh['api_key']}"},
        json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text


@pytest.fixture
def engine(tiny: tuple[Any, Any]) -> Iterator[Served]:
    from tracerl.config import EngineConfig
    from tracerl.engine.local import LocalEngine
    from tracerl.engine.server import build_engine_app, start_server

    model, tokenizer = tiny
    parts: dict[str, Any] = {}

    async def build() -> tuple[Any, str, dict[str, Any]]:
        local = LocalEngine(
            EngineConfig(model="tiny", max_model_len=96, max_running_requests=8),
            model=model, tokenizer=tokenizer,
        )  # fmt: skip
        await local.start()
        runner, port = await start_server(build_engine_app(local), "127.0.0.1", 0)
        parts["engine"] = local
        return runner, f"http://127.0.0.1:{port}", {}

    served = Served(build)
    yield served
    served.close(parts["engine"].close)


def test_the_engine_survives_its_fuzzed_surface(engine: Served) -> None:
    url = engine.url
    doc = requests.get(f"{url}/openapi.json", timeout=30).json()

    def prepare(operation: Any, mode: str) -> dict[str, Any]:
        return {}

    def check(case: Any, response: requests.Response) -> None:
        status = response.status_code
        assert status < 500 or (status == 503 and case.operation.path == "/health_generate"), (
            f"{case.method} {case.formatted_path}: {status} {response.text[:300]}"
        )
        if status >= 400 and status != 503:
            body = _json(case, response)
            error = body.get("error") if isinstance(body, dict) else None
            native = isinstance(error, dict) and "message" in error and "code" in error
            weights = (  # SGLang's form of a refused load
                case.operation.path in ("/update_weights_from_disk", "/load_lora_adapter")
                and body.get("success") is False
            )
            assert native or weights, f"{case.operation.path} {status}: {body}"
        if case.operation.path == "/pause_generation" and status == 200:
            requests.post(f"{url}/continue_generation", timeout=30)  # keep it generating

    statuses = fuzz(doc, url, prepare, check)
    print("engine fuzz:", sum(statuses.values()), "requests", sorted(statuses.items()))
    assert any(k.startswith("POST /generate 200") for k in statuses)
    assert requests.get(f"{url}/health", timeout=30).status_code == 200
    out = requests.post(
        f"{url}/generate",
        json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}},
        timeout=60,
    )
    assert out.status_code == 200 and len(out.json()["output_ids"]) == 3
