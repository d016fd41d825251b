"""Launching engine servers: process groups, log files, start-up errors, and the `sim` and
`local` backends launched by the pool for real."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_until
from tracerl.config import ConfigError, EngineConfig, PoolConfig
from tracerl.engine.types import GenerateRequest
from tracerl.models import resolve_model
from tracerl.rollout import backends
from tracerl.rollout.backends import check_installed, launch_command, start_pool
from tracerl.rollout.launcher import EngineStartError, ProcessLauncher

# Starts a grandchild that would outlive a parent stopped alone, prints its pid and a URL.
FORKING = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"child {child.pid}", flush=True)
print("ready on http://127.0.0.1:1", flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is dead
        return f.read().split()[2] != "Z"


async def test_stop_kills_the_whole_process_group_and_the_log_keeps_the_output(
    tmp_path: Path,
) -> None:
    log = tmp_path / "engine-0.log"
    launcher = ProcessLauncher([sys.executable, "-c", FORKING], log_path=log)
    assert await launcher.start() == "http://127.0.0.1:1"
    await wait_until(lambda: "child " in log.read_text(), "the child's pid in the log")
    child = int(log.read_text().split("child ")[1].split()[0])
    assert alive(child)
    await launcher.stop()
    await wait_until(lambda: not alive(child), "the forked worker gone with its parent")
    assert not launcher.alive()


async def test_an_engine_that_exits_names_its_log_and_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "engine-0.log"
    argv = [sys.executable, "-c", "print('cannot load the model: bad dtype'); raise SystemExit(3)"]
    with pytest.raises(EngineStartError) as e:
        await ProcessLauncher(argv, log_path=log, name="vllm engine 0").start()
    message = str(e.value)
    assert "vllm engine 0 exited (code 3)" in message
    assert str(log) in message and "cannot load the model: bad dtype" in message


async def test_an_engine_that_never_gets_ready_times_out_naming_its_log(tmp_path: Path) -> None:
    log = tmp_path / "engine-0.log"
    argv = [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(600)"]

    async def never(url: str) -> bool:
        return False

    launcher = ProcessLauncher(argv, ready_timeout_s=2, log_path=log, ready=never)
    argv_url = ProcessLauncher(argv, url="http://127.0.0.1:9", ready_timeout_s=2, log_path=log)
    for each in (launcher, argv_url):
        with pytest.raises(EngineStartError, match="did not become ready within 2 s"):
            await each.start()
        assert not each.alive()


async def test_an_engine_that_dies_under_its_readiness_probe_is_named_not_waited_out(
    tmp_path: Path,
) -> None:
    # vLLM on CPU with an attention shape it cannot run: the engine core dies on the probe's
    # token while the API server holds the probe open; the probe gave up only with the whole
    # start-up timeout (900 s), and the run sat silent that long
    log = tmp_path / "engine-0.log"
    script = (
        "import time; print('ready on http://127.0.0.1:1', flush=True); time.sleep(1); "
        "print('Unsupported CPU attention', flush=True); raise SystemExit(3)"
    )
    argv = [sys.executable, "-c", script]
    held: list[str] = []

    async def hangs(url: str) -> bool:  # a request the dying server never answers
        held.append(url)
        await asyncio.Event().wait()
        return True

    launcher = ProcessLauncher(
        argv, ready_timeout_s=300, log_path=log, ready=hangs, probe_timeout_s=0.5
    )
    with pytest.raises(EngineStartError) as e:
        await launcher.start()
    assert "exited (code 3) before it was ready" in str(e.value)
    assert "Unsupported CPU attention" in str(e.value) and held


def test_a_missing_backend_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends._MODULES, "sglang", "tracerl_test_no_such_package")
    with pytest.raises(ConfigError) as e:
        check_installed(EngineConfig(backend="sglang"))
    assert "engine.backend = 'sglang'" in str(e.value) and "tracerl[sglang]" in str(e.value)


def test_launch_commands_carry_the_engine_settings() -> None:
    smol = resolve_model("smollm2-135m")
    config = EngineConfig(
        backend="vllm", max_model_len=1024, kv_cache_tokens=4096, max_running_requests=32,
        seed=5, launch_args=["--enforce-eager"],
    )  # fmt: skip
    argv, env = launch_command(config, smol, 8123)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(argv)
    for flag in ("--port 8123", "--host 127.0.0.1", "--max-model-len 1024", "--seed 5",
                 "--max-num-seqs 32", "--enable-scale-out",
                 "--logprobs-mode processed_logprobs"):  # fmt: skip
        assert flag in joined
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x K and V x 4 bytes per token
    assert f"--kv-cache-memory-bytes {4096 * 30 * 3 * 64 * 2 * 4}" in joined
    assert argv[-1] == "--enforce-eager" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "--stream-interval 8" in joined and env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "60"
    # compact JSON under a schema: vLLM reads this from its server config, not from requests
    at = argv.index("--structured-outputs-config")
    assert json.loads(argv[at + 1]) == {"backend": "guidance", "disable_any_whitespace": True}
    sglang, _ = launch_command(config.model_copy(update={"backend": "sglang"}), smol, 8124)
    joined = " ".join(sglang)
    for flag in ("sglang.launch_server", "--model-path", "--incremental-streaming-output",
                 "--enable-metrics", "--max-total-tokens 4096",
                 "--context-length 1024"):  # fmt: skip
        assert flag in joined
    assert "--enable-return-routed-experts" not in joined  # a dense model


def test_sglang_returns_a_moe_models_routed_experts(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 2, "num_experts_per_tok": 2, "num_local_experts": 8})
    )
    config = EngineConfig(backend="sglang")
    assert "--enable-return-routed-experts" in launch_command(config, tmp_path, 8125)[0]
    off = config.model_copy(update={"record_routed_experts": False})
    assert "--enable-return-routed-experts" not in launch_command(off, tmp_path, 8125)[0]


def test_lora_launches_enable_runtime_adapters_on_vllm_and_sglang() -> None:
    config = EngineConfig(backend="vllm", lora_rank=4)
    argv, env = launch_command(config, resolve_model("tiny"), 8000)
    assert "--enable-lora" in argv and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert argv[argv.index("--max-lora-rank") + 1] == "8"  # vLLM's smallest rank from 4 up
    assert argv[argv.index("--max-loras") + 1] == "4"
    sglang, _ = launch_command(
        config.model_copy(update={"backend": "sglang"}), resolve_model("tiny"), 1
    )
    assert "--enable-lora" in sglang and sglang[sglang.index("--max-lora-rank") + 1] == "4"
    assert sglang[sglang.index("--max-loras-per-batch") + 1] == "4"
    plain, env = launch_command(EngineConfig(backend="vllm"), resolve_model("tiny"), 2)
    assert "--enable-lora" not in plain and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env


@pytest.mark.parametrize("backend", ["sim", "local"])
async def test_the_pool_launches_engines_of_a_backend(backend: str, tmp_path: Path) -> None:
    config = EngineConfig(backend=backend, count=2, kv_cache_tokens=2048)  # type: ignore[arg-type]
    pool = await start_pool(config, resolve_model("tiny"), tmp_path, PoolConfig())
    try:
        assert [m.active for m in pool.members] == [True, True]
        out = await pool.generate(
            GenerateRequest(rid="s-1", input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4})
        )
        assert 1 <= len(out.output_ids) <= 4 and len(out.output_logprobs) == len(out.output_ids)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["engine-0.log", "engine-1.log"]
        assert "tracerl engine" in (tmp_path / "engine-0.log").read_text()
    finally:
        await pool.close()


async def test_attaching_to_an_unreachable_engine_is_a_config_error(tmp_path: Path) -> None:
    config = EngineConfig(backend="vllm", urls=["http://127.0.0.1:9"])
    with pytest.raises(ConfigError, match="engine.urls: cannot reach the vllm engine"):
        await start_pool(config, resolve_model("tiny"), tmp_path, PoolConfig())
