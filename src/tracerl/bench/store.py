"""`tracerl bench store`: turns per second recorded by 4 gateways at once, into one PostgreSQL
server (one store every gateway and the trainer share) against one SQLite file per gateway
(the embedded default), side by side in one run.

Each "gateway" is a process of its own writing through the store exactly as a gateway does
(`create_session`, then each turn's `append_turn`, which returns only once the turn has
committed), with 16 sessions in flight of 8 turns each; turns carry a request, a response and
~200 token ids with their log-probs, like a short agent turn. The clock runs from when every
writer is ready until the last commit. The server is a throwaway cluster on 127.0.0.1 (Debian's
`postgresql`, its defaults: every commit is flushed to disk). SQLite runs twice: the gateway's
default (`synchronous = normal`: survives `kill -9`, no fsync) and `full` (an fsync per commit,
the server's durability). Reported: turns/s of each, and their ratios; there is no target (the
point of the server store is one store for many machines, not speed on one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

from tracerl.trace.schema import Turn

WRITERS = 4
SESSIONS_IN_FLIGHT = 16
TURNS_PER_SESSION = 8


def _turn(index: int) -> Turn:
    prompt = list(range(100 + index * 60))
    completion = list(range(1000, 1060))
    return Turn.model_validate(
        {
            "index": index,
            "endpoint": "chat.completions",
            "parent": index - 1 if index else None,
            "prompt_ids": prompt,
            "completion_ids": completion,
            "completion_logprobs": [-0.5] * len(completion),
            "finish_reason": "stop",
            "weight_version": 0,
            "request": {"messages": [{"role": "user", "content": "x" * 200}]},
            "response": {"content": "y" * 200},
        }
    )


async def _write(where: str, writer: int, sessions: int) -> int:
    from tracerl.gateway.store import open_store

    path, _, synchronous = where.partition("#")  # "FILE#full": fsync every commit
    store = await open_store(path, "full" if synchronous == "full" else "normal")
    turns = [_turn(i) for i in range(TURNS_PER_SESSION)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for k in range(sessions):
        queue.put_nowait(k)

    async def worker() -> int:
        done = 0
        while not queue.empty():
            sid = f"w{writer}-s{queue.get_nowait()}"
            await store.create_session(sid, "h", {})
            for t in turns:
                await store.append_turn(sid, t)
                done += 1
        return done

    counts = await asyncio.gather(*(worker() for _ in range(SESSIONS_IN_FLIGHT)))
    await store.close()
    return sum(counts)


def _writer(where: str, writer: int, sessions: int, start: Any, ready: Any, out: Any) -> None:
    import tracerl.gateway.store  # noqa: F401 (imported before the clock starts)

    ready.put(writer)
    start.wait()
    out.put(asyncio.run(_write(where, writer, sessions)))


def _result(out: Any, procs: list[Any]) -> int:
    """The next writer's count; a writer that died fails the benchmark instead of a wait."""
    import queue

    while True:
        try:
            return int(out.get(timeout=1.0))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a writer exited with {dead[0]} (its error is above)") from None


def measure(places: list[str], sessions: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    start, ready, out = ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(where, w, sessions, start, ready, out))
        for w, where in enumerate(places)
    ]
    for p in procs:
        p.start()
    for _ in procs:  # every writer has imported what it needs
        ready.get(timeout=300)
    began = time.perf_counter()
    start.set()
    turns = sum(_result(out, procs) for _ in procs)
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join(60)
    return {"turns": turns, "seconds": round(elapsed, 2), "turns_per_s": round(turns / elapsed, 1)}


def main(args: argparse.Namespace) -> int:
    from tracerl.bench.postgres_server import temporary_server

    sessions = 100 if args.quick else 1000
    with tempfile.TemporaryDirectory(prefix="tracerl-bench-store-") as tmp:
        files = [str(Path(tmp) / f"gateway-{w}.sqlite") for w in range(WRITERS)]
        sqlite = measure(files, sessions)
        print(json.dumps({"store": "sqlite, a file per gateway", **sqlite}), flush=True)
        synced = measure([f"{f}-full#full" for f in files], sessions)
        print(json.dumps({"store": "sqlite, a file per gateway, fsync", **synced}), flush=True)
        with temporary_server() as url:
            postgres = measure([url] * WRITERS, sessions)
        print(json.dumps({"store": "postgresql, one server", **postgres}), flush=True)
    print(
        json.dumps(
            {
                "benchmark": "store",
                "writers": WRITERS,
                "turns_per_writer": sessions * TURNS_PER_SESSION,
                "sqlite_per_gateway_turns_per_s": sqlite["turns_per_s"],
                "sqlite_per_gateway_fsync_turns_per_s": synced["turns_per_s"],
                "postgres_shared_turns_per_s": postgres["turns_per_s"],
                "postgres_to_sqlite": round(postgres["turns_per_s"] / sqlite["turns_per_s"], 3),
                "postgres_to_sqlite_fsync": round(
                    postgres["turns_per_s"] / synced["turns_per_s"], 3
                ),
                "target": None,
                "target_met": True,
            }
        ),
        flush=True,
    )
    return 0
