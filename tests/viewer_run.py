"""A run directory written the way a run writes it, for the viewer's tests: sessions recorded
through the real `SQLiteTraceStore` (a tool-calling chat session, a fork, an Anthropic session
with tool blocks, a session with no turns), `episodes.jsonl` through the loop's `EpisodeLog`,
`episodes_failed.jsonl`, `metrics.jsonl` and `config.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracerl.envs import EpisodeResult
from tracerl.gateway.store import SQLiteTraceStore
from tracerl.run.episode_log import EpisodeLog
from tracerl.run.rollouts import Rollout
from tracerl.trace.schema import Turn

CONFIG = {"trainer": {"model": "no-such-model", "algorithm": "grpo", "std_normalize": True},
          "env": {"name": "calculator"}}  # fmt: skip


def turn(index: int, prompt: list[int], completion: list[int], **extra: Any) -> Turn:
    body: dict[str, Any] = {
        "index": index,
        "endpoint": "chat.completions",
        "prompt_ids": prompt,
        "completion_ids": completion,
        "completion_logprobs": [-0.1 * (i + 1) for i in range(len(completion))],
        "finish_reason": "stop",
        "weight_version": index,
        "request": {"messages": [{"role": "user", "content": f"question {index}"}]},
        "response": {"choices": [{"message": {"role": "assistant", "content": f"answer {index}"}}]},
    }
    return Turn.model_validate({**body, **extra})


TOOL_REQUEST = {
    "messages": [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "calculate", "arguments": "{\"expression\": \"2+3\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ],
    "tools": [{"type": "function", "function": {"name": "calculate", "parameters": {}}}],
}  # fmt: skip

ANTHROPIC_REQUEST = {
    "system": "be brief",
    "messages": [
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}]},
    ],
}  # fmt: skip


async def write_sessions(store_path: Path) -> dict[str, list[Turn]]:
    """The sessions, recorded through the store; their turns by session id."""
    sessions = {
        # chat with a tool call and its result: two turns, the second extends the first
        "s-tools": [
            turn(0, [1, 2, 3], [10, 11]),
            turn(1, [1, 2, 3, 10, 11, 4, 5], [12, 13, 14], parent=0, request=TOOL_REQUEST),
        ],
        # a fork: turn 2 extends turn 0 again, after turn 1 already did
        "s-fork": [
            turn(0, [1, 2], [20, 21]),
            turn(1, [1, 2, 20, 21, 6], [22], parent=0),
            turn(2, [1, 2, 20, 21, 7], [23, 24], parent=0),
        ],
        "s-anthropic": [
            turn(
                0,
                [1],
                [30],
                endpoint="messages",
                request=ANTHROPIC_REQUEST,
                response={"role": "assistant", "content": [{"type": "text", "text": "3"}]},
            ),
        ],
        "s-empty": [],
    }
    store = SQLiteTraceStore(store_path)
    try:
        for sid, turns in sessions.items():
            await store.create_session(sid, "hash", {})
            for t in turns:
                await store.append_turn(sid, t)
            if sid != "s-fork":
                await store.close_session(sid)
    finally:
        await store.close()
    return sessions


def write_episodes(run_dir: Path) -> None:
    """Group 0: s-tools, s-fork, s-anthropic (rewards 1, 0, 0.5), trained at step 3; s-empty
    failed in group 1."""
    log = EpisodeLog(run_dir)
    rewards = {"s-tools": 1.0, "s-fork": 0.0, "s-anthropic": 0.5}
    for k, (sid, reward) in enumerate(rewards.items()):
        rollout = Rollout(0, "train", EpisodeResult(reward), session_id=sid, tokens=3, version=k)
        log.record(rollout, f"g0-{k}", step=k, env="calculator")
    failed = Rollout(1, "train", EpisodeResult(None, failed=True, reason="timeout after 5 s"),
                     session_id="s-empty")  # fmt: skip
    log.record(failed, "g1-0", step=2, env="calculator")  # and in episodes_failed.jsonl
    log.close()
    line = {"group": 0, "outcome": "trained", "step": 3, "rewards": list(rewards.values())}
    (run_dir / "groups.jsonl").write_text(json.dumps(line) + "\n")  # group 1 never ended


async def make_run(run_dir: Path, torn_metrics: bool = False) -> dict[str, list[Turn]]:
    run_dir.mkdir(parents=True, exist_ok=True)
    sessions = await write_sessions(run_dir / "traces.sqlite")
    write_episodes(run_dir)
    lines = [json.dumps({"step": s, "rollout/reward_mean": s / 10, "actor/policy_loss": -s})
             for s in (1, 2, 3)]  # fmt: skip
    if torn_metrics:
        lines.insert(1, '{"step": 4, "rollout/rew')  # a line cut by a kill, then more lines
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    (run_dir / "config.json").write_text(json.dumps(CONFIG))
    return sessions
