"""`tracerl gateway` and `tracerl serve`: the gateway in front of engines, or of an embedded one.

`serve --demo` is the quickstart's main job until training lands: it opens a session, sends one
chat request through the official `openai` SDK, prints the answer and what the trace recorded,
and exits. With `[telemetry]` on, both export request spans (and the pool's generation spans)
and flush them on the way out.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from tracerl import eventloop
from tracerl.config import (
    ConfigError,
    EngineConfig,
    GatewayCommandConfig,
    GatewayConfig,
    PoolConfig,
    ServeConfig,
)
from tracerl.telemetry import Telemetry, start_telemetry


def _use_template(config: GatewayConfig, tokenizer: Any) -> None:
    """`gateway.chat_template` onto the tokenizer the gateway renders with; a model without a
    template and no setting is a `ConfigError` naming it."""
    from tracerl.chat_templates import read_template

    if config.chat_template is not None:
        try:
            tokenizer.chat_template = read_template(config.chat_template)
        except ValueError as e:
            raise ConfigError(f"gateway.chat_template: {e}") from None
    if not tokenizer.chat_template:
        raise ConfigError(
            f"gateway.chat_template: {config.model} has no chat template; set "
            "--gateway.chat_template to a built-in one (chatml, gemma) or a Jinja file"
        )


async def _gateway_up(
    config: GatewayConfig, engine: Any, tokenizer: Any, telemetry: Telemetry
) -> tuple[Any, Any, Any, str]:
    from tracerl.engine.server import start_server
    from tracerl.gateway.server import Gateway
    from tracerl.gateway.store import open_store

    _use_template(config, tokenizer)
    info = await engine.model_info()
    store = await open_store(config.store, config.store_synchronous)
    gateway = Gateway(
        engine,
        tokenizer,
        store,
        model_name=config.model,
        eos_ids=set(info.get("eos_token_ids") or [tokenizer.eos_token_id]),
        admin_key=config.admin_key,
        system_prompt=config.system_prompt,
        max_request_bytes=config.max_request_bytes,
        max_model_len=info.get("max_model_len"),
        max_tokens_policy=config.max_tokens_policy,
        access_log=config.access_log,
        telemetry=telemetry,
        history=config.history,
        chat_format=config.chat_format,
        record_routed_experts=config.record_routed_experts,
    )
    runner, port = await start_server(
        gateway.app(), config.host, config.port, cancel_on_disconnect=False
    )
    eventloop.settle_heap()
    url = f"http://{config.host}:{port}"
    where = getattr(store, "path", "")  # a PostgreSQL URL without its password
    print(f"tracerl gateway: {url} (model {config.model}, store {where})", flush=True)
    # A generated key is printed once, whole: it is the only way to learn it. A given one is
    # the caller's secret and is never written out in full.
    given = config.admin_key is not None
    shown = f"the one given (...{gateway.admin_key[-4:]})" if given else gateway.admin_key
    print(f"admin key: {shown}", flush=True)
    print(
        f"open a session: curl -s -X POST {url}/sessions "
        f"-H 'Authorization: Bearer {'$ADMIN_KEY' if given else gateway.admin_key}'",
        flush=True,
    )
    return gateway, store, runner, url


async def _engines(
    engine: EngineConfig, urls: list[str], pool: PoolConfig, logs: Path, telemetry: Telemetry
) -> tuple[Any, Any]:
    """The pool of `engine.backend` engines (attached to `urls`, or launched) and the model's
    tokenizer; configuration errors name the setting."""
    from transformers import AutoTokenizer

    from tracerl.models import ModelNotFoundError, resolve_model
    from tracerl.rollout.backends import start_pool

    try:
        model_dir = resolve_model(engine.model)
    except ModelNotFoundError as e:
        raise ConfigError(f"gateway.model: {e}") from None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    attach = engine.model_copy(update={"urls": urls or engine.urls})
    return await start_pool(attach, model_dir, logs, pool, telemetry=telemetry), tokenizer


async def _gateway_main(config: GatewayCommandConfig) -> int:
    from tracerl.rollout.backends import backend_log_dir

    gateway = config.gateway
    engine = config.engine.model_copy(update={"model": gateway.model})
    logs = backend_log_dir(engine, Path("engine-logs"))
    telemetry = start_telemetry(config.telemetry)
    try:
        pool, tokenizer = await _engines(engine, gateway.engine_urls, config.pool, logs, telemetry)
        try:
            _, store, runner, _ = await _gateway_up(gateway, pool, tokenizer, telemetry)
            try:
                await eventloop.wait_for_signal()
            finally:
                await runner.cleanup()
                await store.close()
        finally:
            await pool.close()
    finally:
        await telemetry.close()  # every span ended above is exported
    return 0


async def _serve_main(config: ServeConfig, demo: bool, prompt: str) -> int:
    started = time.monotonic()
    telemetry = start_telemetry(config.telemetry)
    try:
        return await _serve(config, demo, prompt, started, telemetry)
    finally:
        await telemetry.close()  # every span ended in the serve is exported


async def _serve(
    config: ServeConfig, demo: bool, prompt: str, started: float, telemetry: Telemetry
) -> int:
    from tracerl.cli.engine import build_engine
    from tracerl.rollout.backends import backend_log_dir

    if config.engine.backend == "local" and not config.engine.urls:
        engine: Any = build_engine(config.engine)  # no pool: no engine.generate spans
        await engine.start()
        tokenizer = engine.tokenizer
    else:
        logs = backend_log_dir(config.engine, Path("engine-logs"))
        engine, tokenizer = await _engines(config.engine, [], config.pool, logs, telemetry)
    try:
        gateway_config = config.gateway.model_copy(update={"model": config.engine.model})
        gateway, store, runner, url = await _gateway_up(
            gateway_config, engine, tokenizer, telemetry
        )
        print(f"ready in {time.monotonic() - started:.1f} s", flush=True)
        try:
            if demo:
                await _demo(url, gateway.admin_key, prompt)
                return 0
            await eventloop.wait_for_signal()
            return 0
        finally:
            await runner.cleanup()
            await store.close()
    finally:
        await engine.close()


async def _demo(url: str, admin_key: str, prompt: str) -> None:
    """One traced chat turn through the official openai SDK, as any agent would send it."""
    import aiohttp
    import openai

    headers = {"Authorization": f"Bearer {admin_key}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/sessions", headers=headers) as resp:
            session = await resp.json()
        client = openai.AsyncOpenAI(base_url=session["openai_base_url"], api_key=session["api_key"])
        messages: list[Any] = [{"role": "user", "content": prompt}]
        print(
            f"request: POST {session['openai_base_url']}/chat/completions messages={messages}",
            flush=True,
        )
        started = time.monotonic()
        reply = await client.chat.completions.create(
            model="default", messages=messages, max_tokens=64, temperature=0.0
        )
        elapsed = time.monotonic() - started
        choice = reply.choices[0]
        print(
            f"answer ({reply.usage.completion_tokens if reply.usage else '?'} tokens, "
            f"finish {choice.finish_reason}, {elapsed:.2f} s): {choice.message.content}",
            flush=True,
        )
        await client.close()
        async with http.get(f"{url}/sessions/{session['session_id']}", headers=headers) as resp:
            trace = await resp.json()
    turn, traj = trace["turns"][0], trace["trajectories"][0]
    print(
        f"recorded: session {trace['session_id']}, {len(trace['turns'])} turn, "
        f"{len(turn['prompt_ids'])} prompt + {len(turn['completion_ids'])} sampled tokens, "
        f"loss_mask sum {sum(traj['loss_mask'])}, weight_version {turn['weight_version']}",
        flush=True,
    )


def run_gateway(config: GatewayCommandConfig) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return eventloop.run(_gateway_main(config))
    return 130


def run_serve(config: ServeConfig, demo: bool, prompt: str) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return eventloop.run(_serve_main(config, demo, prompt))
    return 130
