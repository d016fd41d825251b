"""`tracerl view` over real sockets: every page of a run written the way a run writes it, the
messages for what cannot be shown, live refresh of any page, the export, the admin key, and
that the run directory is never written."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.viewer_run import make_run
from tracerl.config import ViewConfig
from tracerl.trace.schema import SessionTrace
from tracerl.view.server import start

Get = Callable[..., Awaitable[tuple[int, str]]]


@pytest.fixture
async def view(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[tuple[str, Get]]]]:
    """Start viewers (port 0); each gives its URL and a GET that returns status and text."""
    runners: list[Any] = []
    http = aiohttp.ClientSession()

    async def open_view(run_dir: Path, **settings: Any) -> tuple[str, Get]:
        runner, url = await start(ViewConfig(run_dir=str(run_dir), port=0, **settings))
        runners.append(runner)

        async def get(path: str, **kwargs: Any) -> tuple[int, str]:
            async with http.get(url.rstrip("/") + path, **kwargs) as r:
                return r.status, await r.text()

        return url, get

    yield open_view
    await http.close()
    for runner in runners:
        await runner.cleanup()


def snapshot(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.iterdir()}


async def test_pages_of_a_run(tmp_path: Path, view: Any) -> None:
    run_dir = tmp_path / "run"
    await make_run(run_dir)
    before = snapshot(run_dir)
    url, get = await view(run_dir)
    status, page = await get("/")
    assert status == 200 and "model no-such-model, algorithm grpo" in page
    assert page.count("<figure class=chart") == 8 and "cdn" not in page.lower()
    status, data = await get("/api/metrics")
    assert [r["step"] for r in json.loads(data)["records"]] == [1, 2, 3]
    for script in ("/static/chart.js", "/static/view.js", "/static/view.css"):
        assert (await get(script))[0] == 200

    status, page = await get("/episodes")
    assert status == 200 and "<span id=episode-count>4</span>" in page
    assert "timeout after 5 s" in page and "not in store" not in page
    status, page = await get("/episodes?failed=no&reward_min=0.4")
    assert re.findall(r'href="/sessions/([\w-]+)"', page) == ["s-anthropic", "s-tools"]
    status, page = await get("/episodes?step=oops")
    assert "filter step=oops ignored" in page

    status, page = await get("/groups/0")
    assert status == 200 and page.count("class=sample>") == 3
    # grpo over rewards 1, 0, 0.5: mean 0.5, population std sqrt(1/6) = 0.408
    assert "advantage <b>1.225</b>" in page and "advantage <b>-1.225</b>" in page
    assert "advantage <b>0.000</b>" in page and "question 0" in page
    assert "trained at step 3" in page
    status, page = await get("/groups/1")
    assert status == 200 and "not ended: its episodes are still playing" in page

    status, page = await get("/sessions/s-tools")
    assert status == 200 and "turns (2)" in page
    assert 'class="part tool_call"' in page and "calculate (call_1)" in page
    assert 'class="part tool_result"' in page
    sampled = re.findall(r'class="tok s" data-id="(\d+)"', page)
    assert sampled == ["10", "11", "12", "13", "14"]  # exactly the completions
    assert page.count("class=turn-mark") == 2 and "turn 1 · v1" in page
    assert "could not be loaded" in page  # the config's model has no tokenizer: ids, said so
    assert f"curl -s {url}api/sessions/s-tools" in page

    status, page = await get("/sessions/s-fork")
    assert "fork of turn 0" in page and 'data-live="/sessions/s-fork/live"' in page
    status, page = await get("/sessions/s-empty")
    assert status == 200 and "this session has no turns" in page
    assert "failed: timeout after 5 s" in page
    status, page = await get("/sessions/unknown")
    assert "session unknown: not in traces.sqlite" in page

    status, body = await get("/api/sessions/s-fork")
    trace = SessionTrace.model_validate_json(body)
    assert [t.index for t in trace.turns] == [0, 1, 2] and len(trace.trajectories) == 2
    assert (await get("/api/sessions/nope"))[0] == 404
    assert (await get("/favicon.ico"))[0] == 204
    assert snapshot(run_dir) == before  # read, never written


async def test_what_cannot_be_shown_is_said(tmp_path: Path, view: Any) -> None:
    _, get = await view(tmp_path / "nowhere")
    for path in ("/", "/episodes", "/sessions/x", "/groups/1"):
        status, page = await get(path)
        assert status == 200 and "does not exist" in page, path
    assert (await get("/api/metrics"))[0] == 503

    run_dir = tmp_path / "starting"
    run_dir.mkdir()
    _, get = await view(run_dir)
    status, page = await get("/episodes")  # no store, no episodes yet
    assert "traces.sqlite: not in the run directory" in page
    status, data = await get("/api/metrics")
    assert "metrics.jsonl: not written yet" in data

    torn = tmp_path / "torn"
    await make_run(torn, torn_metrics=True)
    _, get = await view(torn)
    status, data = await get("/api/metrics")
    body = json.loads(data)
    assert [r["step"] for r in body["records"]] == [1, 2, 3]
    assert body["problems"] == ["metrics.jsonl: skipped unreadable (truncated?) line(s) 2"]


async def test_any_page_refreshes_as_the_run_writes(tmp_path: Path, view: Any) -> None:
    run_dir = tmp_path / "run"
    await make_run(run_dir)
    _, get = await view(run_dir, page_size=2)
    _, page = await get("/episodes?page=1")
    live = re.search(r'data-live="([^"]+)"', page)
    assert live is not None and live.group(1) == "/episodes/rows?page=1"
    _, rows = await get(live.group(1))
    assert re.findall(r'href="/sessions/([\w-]+)"', rows) == ["s-fork", "s-tools"]
    with (run_dir / "episodes.jsonl").open("a") as f:
        for sid in ("n1", "n2"):
            f.write(json.dumps({"session_id": sid, "group": 5, "step": 3}) + "\n")
    _, rows = await get(live.group(1))  # page 2 now holds what page 1 held
    assert re.findall(r'href="/sessions/([\w-]+)"', rows) == ["s-empty", "s-anthropic"]
    assert "<span id=episode-count>6</span>" in rows
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "rollout/reward_mean": 1.0}) + "\n")
    _, data = await get("/api/metrics")
    assert [r["step"] for r in json.loads(data)["records"]] == [1, 2, 3, 4]


async def test_admin_key(tmp_path: Path, view: Any) -> None:
    run_dir = tmp_path / "run"
    await make_run(run_dir)
    url, get = await view(run_dir, admin_key="sekrit")
    assert (await get("/api/sessions/s-tools"))[0] == 401
    assert (await get("/static/view.js"))[0] == 401
    bearer = {"Authorization": "Bearer sekrit"}
    assert (await get("/api/sessions/s-tools", headers=bearer))[0] == 200
    assert (await get("/", headers={"x-api-key": "sekrit"}))[0] == 200
    assert (await get("/", headers={"x-api-key": "wrong"}))[0] == 401
    _, page = await get("/sessions/s-tools", headers=bearer)
    curl = "-H 'Authorization: Bearer $TRACERL_VIEW_KEY'"
    assert curl in html.unescape(page) and "sekrit" not in page
    jar = aiohttp.CookieJar(unsafe=True)  # as browsers do, keep cookies of an IP address
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:  # ?key= once, then the cookie
        async with browser.get(f"{url}episodes?key=sekrit&step=1") as r:
            assert r.status == 200 and str(r.url) == f"{url}episodes?step=1"
        async with browser.get(f"{url}groups/0") as r:
            assert r.status == 200


def test_off_loopback_needs_a_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="admin_key: required when host is '0.0.0.0'"):
        ViewConfig(run_dir=str(tmp_path), host="0.0.0.0")
    ViewConfig(run_dir=str(tmp_path), host="::1")
    ViewConfig(run_dir=str(tmp_path), host="0.0.0.0", admin_key="k")


def test_view_command(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "tracerl.cli.main", "view"]
    help_text = subprocess.run([*command, "--help"], capture_output=True, text=True, env=env)
    assert help_text.returncode == 0
    assert "usage: tracerl view" in help_text.stdout and "--port PORT" in help_text.stdout
    assert "refresh_s" in help_text.stdout and "Binds 127.0.0.1" in help_text.stdout
    refused = subprocess.run([*command, str(tmp_path), "--host", "0.0.0.0"],
                             capture_output=True, text=True, env=env)  # fmt: skip
    assert refused.returncode == 2 and "admin_key: required" in refused.stderr
    process = subprocess.Popen([*command, str(tmp_path / "absent"), "--port", "0"],
                               stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("tracerl view: ") and " on http://127.0.0.1:" in line
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0
