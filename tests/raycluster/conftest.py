"""Runs of `tracerl train` placed on Ray (`cluster.backend = "ray"`), as a user starts them:
the CLI in a process of its own, on the `tiny` model, with a private local cluster (or one the
test starts with `ray start`). Skipped without Ray (`make test-ray` installs it). Every wait is a
poll with a deadline; every process a test starts, it stops."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
RUN_DEADLINE_S = 420.0  # a few tiny steps with Ray start-up on 2 busy cores take ~1 minute
pytest.importorskip("ray", reason="Ray is not installed (make test-ray installs it)")

# Two ranks and two engines on a 2-core machine: logical CPUs, not cores.
RAY_ARGS = [
    "--cluster.backend=ray",
    "--cluster.num_cpus=6",
    "--cluster.trainer.ranks=2",
    "--engine.count=2",
]


def train_command(run_dir: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "tracerl.cli.main", "train", str(ROOT / "examples" / "tiny.toml"),
        "--run-dir", str(run_dir), "--logging.progress=false", *args,
    ]  # fmt: skip


class Run:
    """One `tracerl train` process, its output in RUN_DIR.log."""

    def __init__(self, run_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.log = run_dir.parent / f"{run_dir.name}.log"
        self.process = subprocess.Popen(
            train_command(run_dir, *args),
            env=env,
            stdout=open(self.log, "ab"),  # noqa: SIM115 (closed with the process)
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )

    def wait(self, deadline_s: float = RUN_DEADLINE_S) -> int:
        try:
            return self.process.wait(deadline_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"run did not end in {deadline_s} s:\n{self.output()}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def steps(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.is_file() else 0

    def cluster(self) -> dict[str, Any]:
        return dict(json.loads((self.run_dir / "cluster.json").read_text()))

    def until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + RUN_DEADLINE_S
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"run ended before {what}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {RUN_DEADLINE_S} s:\n{self.output()}")
            time.sleep(0.2)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def runs() -> Iterator[Callable[..., Run]]:
    started: list[Run] = []

    def start(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> Run:
        started.append(Run(run_dir, *args, env=env))
        return started[-1]

    yield start
    for run in started:
        run.kill()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited; only its parent has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def until_gone(pids: list[int], deadline_s: float = 60.0) -> list[int]:
    """The pids still alive after waiting up to `deadline_s` for them to exit."""
    deadline = time.monotonic() + deadline_s
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if pid_alive(p)]
    return alive


class TwoNodes:
    """A head and a second node on this machine (`ray start --block`, each its own process
    group), with their own CPUs and custom resources; stopped with their process groups."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.address = f"127.0.0.1:{port}"
        # Ray's token auth on all nodes, with a token of this cluster's own: a fresh machine has
        # no ~/.ray/auth_token, and `ray start` does not create one (the head exits at once)
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.started: list[tuple[Path, subprocess.Popen[bytes]]] = []  # log, `ray start`
        ray = str(Path(sys.executable).parent / "ray")
        common = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats", "--block"]
        self.head = self._start(
            tmp / "head.log",
            [ray, "start", "--head", "--port", str(port), "--num-cpus", "4",
             "--resources", '{"trainer_node": 2}', "--include-dashboard", "false", *common],
        )  # fmt: skip
        self._until_nodes(1)
        self.worker = self._start(
            tmp / "worker.log",
            [ray, "start", "--address", self.address, "--num-cpus", "4",
             "--resources", '{"engine_node": 2, "cpu_node": 4}', *common],
        )  # fmt: skip
        self.nodes = self._until_nodes(2)

    def _start(self, log: Path, argv: list[str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115 (the node's)
            start_new_session=True, env=self.env,
        )  # fmt: skip
        self.started.append((log, process))
        return process

    def _until_nodes(self, count: int) -> dict[str, dict[str, float]]:
        """Node id -> resources, once `count` nodes are alive (each probe a fresh process)."""
        probe = (
            f"import json, ray; ray.init(address={self.address!r}, configure_logging=False); "
            "print(json.dumps({n['NodeID']: n['Resources'] for n in ray.nodes() if n['Alive']}))"
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            for log, process in self.started:
                if process.poll() is not None:  # `--block`: a node that exits has failed
                    self.stop()
                    raise AssertionError(f"`ray start` exited:\n{log.read_text()[-3000:]}")
            out = subprocess.run(
                [sys.executable, "-c", probe], capture_output=True, env=self.env, timeout=120
            )
            if out.returncode == 0:
                nodes = dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))
                if len(nodes) >= count:
                    return nodes
            time.sleep(1)
        self.stop()
        raise AssertionError(
            f"{count} Ray node(s) did not come up; the last probe said:\n"
            f"{out.stderr.decode(errors='replace')[-3000:]}"
        )

    def node_with(self, resource: str) -> str:
        return next(n for n, r in self.nodes.items() if resource in r)

    def stop(self) -> None:
        for _, process in reversed(self.started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for _, process in reversed(self.started):
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    """One two-node cluster for a module's tests (starting one takes ~50 s here)."""
    import socket

    tmp_path = tmp_path_factory.mktemp("two-nodes")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    nodes = TwoNodes(tmp_path, port)
    try:
        yield nodes
    finally:
        nodes.stop()
