"""What `tracerl sft` trains on, as `TrainSample`s whose `loss_mask` marks the trained tokens.

- **Conversations** (`data.source = "messages"`): rows of OpenAI-format `messages` (and
  `tools`), validated as the gateway validates a request, rendered with the model's chat
  template in its chat format. Each assistant message's tokens are what the template writes for
  it after its prompt, through its end-of-turn marker (`ChatRenderer.reply`): the tokens the
  model would have to sample to give that reply. They are tokenized on their own, as a
  generation would produce them, and only they are trained on. A conversation whose template
  renders each prompt as the previous prompt and reply followed by new messages is one sample;
  where it re-renders an earlier reply (Qwen3 dropping reasoning), a new sample starts there,
  its context rendered as the template does.
- **Traces** (`data.source = "traces"`): the episodes of run directories, filtered by their
  `episodes.jsonl` records (kind, environment, reward: rejection sampling on a run's own
  successes), each trajectory of an episode as recorded: its token ids and loss mask exactly,
  nothing re-rendered. Demonstrated turns (`tracerl.envs` scripted policies) are traces too.

Errors name the row (`FILE:LINE`) or the run and session, and the field in the caller's terms.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracerl.config.sft import SftDataConfig
from tracerl.gateway.messages import BadRequest, openai_messages, openai_tools
from tracerl.gateway.render import ChatRenderer, ReplyNotRendered
from tracerl.run.episode_log import EPISODES_FILE, read_episodes
from tracerl.run.rollouts import trace_samples
from tracerl.train.batch import TrainSample

STORE_FILE = "traces.sqlite"


class SftDataError(ValueError):
    """Data SFT cannot train on; the message names the row or session and the field."""


def conversation_samples(
    renderer: ChatRenderer,
    turn_ends: tuple[str, ...],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> list[TrainSample]:
    """One conversation (messages as the gateway validates them) as samples whose loss mask
    is 1 exactly on the assistant messages' tokens."""
    samples: list[TrainSample] = []
    ids: list[int] = []
    mask: list[int] = []
    text = ""
    for at, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt, reply = renderer.reply(messages[:at], message, tools, turn_ends)
        reasoning = message.get("reasoning_content")
        if reasoning and reasoning.strip() not in reply:
            raise ReplyNotRendered(
                f"messages.{at}.reasoning_content: the chat template does not write reasoning "
                "into the reply, so it cannot be trained on"
            )
        if ids and prompt.startswith(text):
            new = prompt[len(text) :]
        else:  # the first reply, or the template re-rendered what came before
            if ids:
                samples.append(_sample(ids, mask))
            ids, mask, new = [], [], prompt
        context, sampled = renderer.tokenize(new), renderer.tokenize(reply)
        ids += context + sampled
        mask += [0] * len(context) + [1] * len(sampled)
        text = prompt + reply
    if ids:
        samples.append(_sample(ids, mask))
    return samples


def with_reasoning(
    messages: list[dict[str, Any]], raw: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The validated `messages` with each assistant message's reasoning from the row (`raw`,
    as `reasoning_content` or `reasoning`), where templates read it (`reasoning_content`): the
    gateway never shows a model its earlier reasoning, but a dataset's replies are trained with
    theirs."""
    out = []
    for i, (message, given) in enumerate(zip(messages, raw, strict=True)):
        reasoning = given.get("reasoning_content", given.get("reasoning"))
        if message["role"] == "assistant" and reasoning is not None:
            if not isinstance(reasoning, str):
                raise BadRequest(f"messages.{i}.reasoning_content", "expected a string")
            message = {**message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _sample(ids: list[int], mask: list[int]) -> TrainSample:
    return TrainSample(ids, mask, [0.0] * len(ids), reward=0.0)


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    """Each row of a JSONL or Parquet file with where it is (`FILE:LINE`, `FILE:row N`)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}:row {i}", row
        return
    if path.suffix != ".jsonl":
        raise SftDataError(f"data.path: {path} is neither .jsonl nor .parquet")
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise SftDataError(f"{where}: not JSON ({e.msg})") from None


def messages_samples(
    path: Path, renderer: ChatRenderer, turn_ends: tuple[str, ...]
) -> list[TrainSample]:
    """Every conversation of a `messages` dataset as samples (`conversation_samples`)."""
    if not path.is_file():
        raise SftDataError(f"data.path: {path} is not a file")
    samples: list[TrainSample] = []
    for where, row in _rows(path):
        if not isinstance(row, dict):
            raise SftDataError(f"{where}: expected an object with messages")
        try:
            messages = with_reasoning(openai_messages(row), row["messages"])
            tools = openai_tools(row) if row.get("tools") else []
        except BadRequest as e:
            raise SftDataError(f"{where}: {e}") from None
        if not any(m["role"] == "assistant" for m in messages):
            raise SftDataError(f"{where}: messages: has no assistant message to train on")
        try:
            samples += conversation_samples(renderer, turn_ends, messages, tools)
        except ReplyNotRendered as e:
            raise SftDataError(f"{where}: messages: {e}") from None
    if not samples:
        raise SftDataError(f"data.path: {path} has no conversations")
    return samples


def _wanted(config: SftDataConfig, row: dict[str, Any]) -> bool:
    """An ended episode's record that `config`'s filters keep (a failed one never)."""
    reward = row.get("reward")
    return (
        not row.get("failed")
        and reward is not None
        and (config.kind is None or row.get("kind") == config.kind)
        and (config.env is None or row.get("env") == config.env)
        and (config.reward_min is None or reward >= config.reward_min)
        and (config.reward_max is None or reward <= config.reward_max)
    )


def _episodes(run: Path, config: SftDataConfig) -> list[dict[str, Any]]:
    if not (run / EPISODES_FILE).is_file():
        raise SftDataError(f"data.runs: {run} has no {EPISODES_FILE} (not a tracerl run)")
    return [row for row in read_episodes(run) if _wanted(config, row)]


def _store_of(run: Path) -> str:
    """Where the run recorded its traces: its config's `trace_store`, else its SQLite file."""
    saved = run / "config.json"
    where = json.loads(saved.read_text()).get("trace_store") if saved.is_file() else None
    if where:
        return str(where)
    if not (run / STORE_FILE).is_file():
        raise SftDataError(f"data.runs: {run} has no {STORE_FILE}")
    return str(run / STORE_FILE)


async def _run_samples(run: Path, config: SftDataConfig, vocab_size: int) -> list[TrainSample]:
    from tracerl.gateway.store import open_store, read_trace
    from tracerl.trace.trajectories import TraceError

    rows = _episodes(run, config)
    if not rows:
        return []
    store = await open_store(_store_of(run))
    samples: list[TrainSample] = []
    try:
        for row in rows:
            sid = row["session_id"]
            try:
                trace = await read_trace(store, sid)
            except TraceError as e:
                raise SftDataError(f"data.runs: {run}: session {sid}: {e}") from None
            if trace is None:
                raise SftDataError(f"data.runs: {run}: session {sid} is not in its trace store")
            found, _ = trace_samples(trace, float(row["reward"]), int(row.get("group", 0)))
            for sample in found:
                if max(sample.token_ids) >= vocab_size:
                    raise SftDataError(
                        f"data.runs: {run}: session {sid} has token id {max(sample.token_ids)}, "
                        f"beyond the model's vocabulary of {vocab_size} (a run of another model?)"
                    )
            samples += found
    finally:
        await store.close()
    return samples


def traces_samples(config: SftDataConfig, vocab_size: int) -> list[TrainSample]:
    """The trajectories of the episodes of `config.runs` that `config`'s filters keep, as
    recorded; a token id the model's vocabulary lacks (another model's run) is an error."""
    samples: list[TrainSample] = []
    for name in config.runs:
        samples += asyncio.run(_run_samples(Path(name), config, vocab_size))
    if not samples:
        raise SftDataError(
            "data.runs: no episode of "
            + ", ".join(config.runs)
            + " passes the filters (data.kind, data.env, data.reward_min, data.reward_max)"
        )
    return samples
