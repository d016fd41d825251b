"""The trace viewer in a real browser: Debian's chromium, driven by Playwright's Python package
pointed at it (Playwright's own browser download cannot work here), against a run directory the
`tiny` loop writes in this test. The run page draws its charts, and redraws them when a step
lands; the episode list lists every episode; an episode opens, its token view marks exactly the
sampled tokens as sampled; a group shows its samples; no page logs a console error.
Screenshots go to $TRACERL_TEST_ARTIFACTS (default: test-artifacts/browser).

`make test-browser` installs chromium (apt) and the `[browser]` extra, then runs this.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("TRACERL_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "browser"
WAIT_MS = 30_000
"""A liveness bound for what the page does on its own (a loaded CI machine only waits longer)."""

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # the [browser] extra is not installed
    sync_playwright = None  # type: ignore[assignment]
if sync_playwright is None or not Path(CHROMIUM).exists():
    pytest.skip(
        "needs Playwright's Python package and Debian's chromium: `make test-browser` installs "
        "both (apt-get install chromium; pip install -e '.[browser]')",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two GRPO steps of the tiny example, run as a user runs it."""
    run_dir = tmp_path_factory.mktemp("browser") / "run"
    command = [sys.executable, "-m", "tracerl.cli.main", "train", str(ROOT / "examples/tiny.toml"),
               "--run-dir", str(run_dir), "--loop.steps=2", "--logging.progress=false"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


@pytest.fixture(scope="module")
def viewer(run_dir: Path) -> Iterator[str]:
    """`tracerl view` over the run; its URL."""
    command = [sys.executable, "-m", "tracerl.cli.main", "view", str(run_dir), "--port", "0",
               "--refresh-s", "0.5"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert " on http://" in line, line
        yield line.split(" on ", 1)[1].split()[0]
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def page(viewer: str) -> Iterator[tuple[Page, list[str]]]:
    """A chromium page, and every console error and uncaught exception it logs."""
    assert sync_playwright is not None
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        yield tab, errors
        browser.close()


def shot(tab: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def episodes(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "episodes.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_the_viewer_in_chromium(run_dir: Path, viewer: str, page: Any) -> None:
    tab, errors = page
    steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
    tab.goto(viewer)
    tab.wait_for_selector(f"#charts[data-drawn='{steps}']", timeout=WAIT_MS)
    drawn = tab.locator("figure.chart:not(.empty)")
    assert drawn.count() >= 5  # reward, lengths, losses, kl, throughput, concurrency
    assert tab.locator("figure[data-chart=reward] path.line").count() == 1
    shot(tab, "run")

    # a step lands: the open page redraws without a reload
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    record["step"] += 1
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")
    tab.wait_for_selector(f"#charts[data-drawn='{steps + 1}']", timeout=WAIT_MS)

    listed = episodes(run_dir)
    assert len(listed) >= 16  # two steps of 8 episodes
    tab.goto(viewer + "episodes")
    assert tab.locator("#episode-rows tr").count() == min(len(listed), 50)
    assert tab.locator("#episode-count").inner_text() == str(len(listed))
    shot(tab, "episodes")

    tab.locator("#episode-rows tr a[href^='/sessions/']").first.click()
    tab.wait_for_selector(".trajectory")
    session_id = tab.url.rsplit("/", 1)[1]
    with urllib.request.urlopen(f"{viewer}api/sessions/{session_id}") as reply:
        trace = json.loads(reply.read())
    trajectories = tab.locator(".trajectory")
    assert trajectories.count() == len(trace["trajectories"]) >= 1
    for i, trajectory in enumerate(trace["trajectories"]):
        shown = trajectories.nth(i)
        sampled = shown.locator(".tok.s").evaluate_all("ts => ts.map(t => +t.dataset.id)")
        context = shown.locator(".tok.c").evaluate_all("ts => ts.map(t => +t.dataset.id)")
        mask, ids = trajectory["loss_mask"], trajectory["token_ids"]
        assert sampled == [t for t, m in zip(ids, mask, strict=True) if m]
        assert context == [t for t, m in zip(ids, mask, strict=True) if not m]
        assert shown.locator(".turn-mark").count() == len(trajectory["turn_indices"])
    assert "could not be loaded" not in tab.content()  # the tiny model's tokenizer gave text
    shot(tab, "session")

    # the newest episode's group may have been cut short by the run's end: it shows what ended
    link = tab.locator("a[href^='/groups/']").first
    group = int((link.get_attribute("href") or "").rsplit("/", 1)[1])
    link.click()
    tab.wait_for_selector(".samples")
    ended = [e for e in listed if e["group"] == group]
    assert tab.locator(".sample").count() == len(ended)
    trained = [json.loads(line)["group"] for line in (run_dir / "groups.jsonl").open()
               if json.loads(line)["outcome"] == "trained"]  # fmt: skip
    tab.goto(f"{viewer}groups/{trained[0]}")
    tab.wait_for_selector(".samples")
    assert tab.locator(".sample").count() == 4  # examples/tiny.toml: groups of 4
    assert tab.locator(".group-outcome").inner_text().startswith("trained at step ")
    shot(tab, "group")
    assert errors == []
