"""The `tracerl` command as a user runs it: help without torch, config errors, a served engine."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

CLI = [sys.executable, "-m", "tracerl.cli.main"]


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys; from tracerl.cli.main import main\n"
        "for argv in (['--help'], ['engine', '--help'], ['serve', '--help']):\n"
        "    try: main(argv)\n"
        "    except SystemExit: pass\n"
        "assert 'torch' not in sys.modules, 'help imported torch'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "engine.kv_cache_tokens" in out.stdout  # config fields are documented in --help


def test_bad_config_fails_before_loading_anything(tmp_path) -> None:
    config = tmp_path / "engine.toml"
    config.write_text("[engine]\nkv_cache_tokens = 'lots'\n")
    out = subprocess.run(
        [*CLI, "engine", str(config), "--server.prot=1"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "engine.kv_cache_tokens: Input should be a valid integer" in out.stderr
    assert "server.prot: unknown key" in out.stderr
    out = subprocess.run([*CLI, "engine", "--model", "/nowhere"], capture_output=True, text=True)
    assert out.returncode == 2 and "engine.model" in out.stderr
    out = subprocess.run([*CLI, "engine", "--engine.backend=vllm"], capture_output=True, text=True)
    assert out.returncode == 2 and "engine.backend: `tracerl engine` serves" in out.stderr
    out = subprocess.run([*CLI, "engine", "--engine.backend=vlm"], capture_output=True, text=True)
    assert out.returncode == 2 and "engine.backend" in out.stderr and "'sglang'" in out.stderr


def test_a_task_field_the_held_out_tasks_lack_is_named_without_a_traceback(tmp_path) -> None:
    """A dataset the run cannot use (here: `eval.by` names a field no eval task has) fails at
    start-up, as a bad config does: exit 2 and the message, not a traceback."""
    tiny = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tiny.toml")
    overrides = ["--eval.every=1", "--eval_dataset.generate=concise", "--eval.by=depth",
                 "--logging.progress=false", f"--run-dir={tmp_path / 'run'}"]  # fmt: skip
    out = subprocess.run([*CLI, "train", tiny, *overrides], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "tracerl: generated concise tasks:row 1: eval.by = 'depth' needs that field" in (
        out.stderr
    )
    assert "Traceback" not in out.stderr


def test_engine_command_serves_until_terminated(tmp_path) -> None:
    proc = subprocess.Popen(
        [*CLI, "engine", "--model", "tiny", "--port", "0", "--run-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "http://" in line or not line:
                break
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        url = match.group(0)
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            assert resp.status == 200
        resolved = json.loads((tmp_path / "config.json").read_text())
        assert resolved["engine"]["model"] == "tiny" and resolved["server"]["port"] == 0
        body = json.dumps(
            {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}}
        ).encode()
        with urllib.request.urlopen(url + "/generate", data=body, timeout=30) as resp:
            assert len(json.loads(resp.read())["output_ids"]) == 3
        # a request held by a paused engine ends with "abort" when the server is terminated
        # (the pool resumes it elsewhere) instead of holding the shutdown for a minute
        urllib.request.urlopen(url + "/pause_generation", data=b"{}", timeout=10).close()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(_post, url + "/generate", body)
            deadline = time.monotonic() + 60
            waiting = re.compile(r"^vllm:num_requests_waiting(\{.*\})? 1\.0$", re.MULTILINE)
            while not waiting.search(_post(url + "/metrics", None)):
                assert time.monotonic() < deadline, "the request never reached the engine"
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            reply = json.loads(held.result())
        assert reply["meta_info"]["finish_reason"] == {"type": "abort"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def _post(url: str, body: bytes | None) -> str:
    """The reply to a POST of `body` (a GET when None)."""
    with urllib.request.urlopen(url, data=body, timeout=30) as resp:
        return resp.read().decode()
