"""What `tracerl sft` trains on: conversations rendered with the chat template, loss on the
assistant's tokens only (checked token by token against the template's own assistant mask),
and a run's recorded traces, taken exactly."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.chat_families import family_tokenizer
from tracerl.config.sft import SftDataConfig
from tracerl.gateway.messages import openai_messages, openai_tools
from tracerl.gateway.render import ChatRenderer, ReplyNotRendered
from tracerl.sft.data import (
    SftDataError,
    conversation_samples,
    messages_samples,
    traces_samples,
    with_reasoning,
)
from tracerl.trace.schema import Turn
from tracerl.trace.trajectories import assemble_trajectories

# ChatML whose assistant turns are marked for transformers' `return_assistant_tokens_mask`:
# the reply's text and its end-of-turn token, what a model samples.
CHATML_MARKED = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' %}{% generation %}{{- m.content + '<|im_end|>' }}"
    "{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CONVERSATION = [
    {"role": "system", "content": "You count."},
    {"role": "user", "content": "One?"},
    {"role": "assistant", "content": "One. Then two, three."},
    {"role": "user", "content": "And after four, what comes?"},
    {"role": "assistant", "content": "Five comes after four."},
]

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
TOOL_CONVERSATION = [
    {"role": "user", "content": "What is 2+3?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculate", "arguments": '{"expression": "2+3"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "assistant", "content": "The answer is 5."},
]


def renderer_of(tokenizer: Any) -> tuple[ChatRenderer, tuple[str, ...]]:
    renderer = ChatRenderer(tokenizer)
    return renderer, renderer.turn_ends({tokenizer.eos_token_id, *renderer.stop_ids()})


def trained_text(renderer: ChatRenderer, ids: list[int], mask: list[int]) -> str:
    return renderer.decode([i for i, m in zip(ids, mask, strict=True) if m])


def test_the_loss_mask_is_the_templates_assistant_mask_token_by_token(tiny) -> None:
    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.chat_template = CHATML_MARKED
    renderer, ends = renderer_of(tokenizer)
    (sample,) = conversation_samples(
        renderer, ends, openai_messages({"messages": CONVERSATION}), []
    )
    marked = tokenizer.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    n = len(sample.token_ids)
    # the same tokens (the template's closing newline after the last reply is not sampled)
    assert sample.token_ids == marked["input_ids"][:n]
    assert renderer.decode(marked["input_ids"][n:]) == "\n"
    assert sample.loss_mask == marked["assistant_masks"][:n]
    assert sum(sample.loss_mask) > 0 and sample.loss_mask[0] == 0
    assert trained_text(renderer, sample.token_ids, sample.loss_mask) == (
        "One. Then two, three.<|im_end|>Five comes after four.<|im_end|>"
    )


def test_tool_calls_are_trained_as_the_format_writes_them_and_results_never(tiny) -> None:
    renderer, ends = renderer_of(tiny[1])  # SmolLM2's template: the Hermes fallback
    body = {"messages": TOOL_CONVERSATION, "tools": [CALC_TOOL]}
    messages, tools = openai_messages(body), openai_tools(body)
    (sample,) = conversation_samples(renderer, ends, messages, tools)
    assert trained_text(renderer, sample.token_ids, sample.loss_mask) == (
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call>'
        "<|im_end|>The answer is 5.<|im_end|>"
    )
    context = renderer.decode(
        [i for i, m in zip(sample.token_ids, sample.loss_mask, strict=True) if not m]
    )
    assert "<tool_response>\n5\n</tool_response>" in context


def test_a_template_that_rewrites_history_starts_a_new_sample_there(tiny) -> None:
    """Qwen3 drops an earlier reply's reasoning once a user message follows: the second reply
    is trained in the context the template gives it, the first in its own."""
    renderer, ends = renderer_of(family_tokenizer("qwen3"))
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye!", "reasoning_content": "Part."},
    ]
    validated = with_reasoning(openai_messages({"messages": messages}), messages)
    first, second = conversation_samples(renderer, ends, validated, [])
    assert trained_text(renderer, first.token_ids, first.loss_mask) == (
        "<think>\nGreet back.\n</think>\n\nHello!<|im_end|>"
    )
    assert trained_text(renderer, second.token_ids, second.loss_mask) == (
        "<think>\nPart.\n</think>\n\nGoodbye!<|im_end|>"
    )
    assert "Greet back." not in renderer.decode(second.token_ids)
    # a template with no place for reasoning: an error, not reasoning silently dropped
    smol, smol_ends = renderer_of(tiny[1])
    with pytest.raises(ReplyNotRendered, match=r"messages.1.reasoning_content: the chat template"):
        conversation_samples(smol, smol_ends, validated, [])


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_dataset_file_is_read_and_its_errors_name_the_row(tiny, tmp_path: Path) -> None:
    renderer, ends = renderer_of(tiny[1])
    good = {"messages": TOOL_CONVERSATION, "tools": [CALC_TOOL]}
    path = write_jsonl(tmp_path / "d.jsonl", [good, {"messages": CONVERSATION}])
    assert len(messages_samples(path, renderer, ends)) == 2
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{"messages": json.loads(json.dumps(CONVERSATION))}])
    pq.write_table(table, tmp_path / "d.parquet")
    assert len(messages_samples(tmp_path / "d.parquet", renderer, ends)) == 1
    bad_role = {"messages": [{"role": "robot", "content": "x"}]}
    no_reply = {"messages": [{"role": "user", "content": "x"}]}
    for rows, wanted in (
        ([good, bad_role], r"d.jsonl:2: messages.0"),
        ([no_reply], r"d.jsonl:1: messages: has no assistant message"),
        (["not an object"], r"d.jsonl:1: expected an object"),
    ):
        with pytest.raises(SftDataError, match=wanted):
            messages_samples(write_jsonl(tmp_path / "d.jsonl", rows), renderer, ends)
    (tmp_path / "d.jsonl").write_text('{"messages": [\n')
    with pytest.raises(SftDataError, match=r"d.jsonl:1: not JSON"):
        messages_samples(tmp_path / "d.jsonl", renderer, ends)


def test_the_shipped_conversations_render_with_smollm2s_template(tiny) -> None:
    renderer, ends = renderer_of(tiny[1])  # the tiny model has SmolLM2's tokenizer
    path = Path(__file__).parents[3] / "examples" / "data" / "conversations.jsonl"
    samples = messages_samples(path, renderer, ends)
    assert len(samples) == 28
    first = trained_text(renderer, samples[0].token_ids, samples[0].loss_mask)
    assert first.startswith('<tool_call>\n{"name": "calculate", "arguments": {"expression": ')
    assert first.endswith("</tool_call><|im_end|>The answer is 12981.<|im_end|>")


def turn(index: int, prompt: list[int], completion: list[int], parent: int | None) -> Turn:
    return Turn(
        index=index, endpoint="chat.completions", prompt_ids=prompt, completion_ids=completion,
        completion_logprobs=[-0.5] * len(completion), finish_reason="stop", weight_version=3,
        request={}, response={}, parent=parent,
    )  # fmt: skip


async def record(path: Path, sessions: dict[str, list[Turn]]) -> None:
    from tracerl.gateway.store import SQLiteTraceStore

    store = SQLiteTraceStore(path)
    for sid, turns in sessions.items():
        await store.create_session(sid, "k", {})
        for t in turns:
            await store.append_turn(sid, t)
    await store.close()


def test_traces_are_taken_as_recorded_and_filtered_by_their_episode_records(
    tmp_path: Path,
) -> None:
    sessions = {
        "won": [turn(0, [1, 2, 3], [4, 5], None), turn(1, [1, 2, 3, 4, 5, 6], [7, 8], 0)],
        "lost": [turn(0, [1, 2], [9], None)],
        "eval": [turn(0, [1, 2], [10], None)],
    }
    asyncio.run(record(tmp_path / "traces.sqlite", sessions))
    rows = [
        {"session_id": "won", "kind": "train", "env": "calc", "reward": 1.0, "group": 4},
        {"session_id": "lost", "kind": "train", "env": "calc", "reward": 0.0, "group": 4},
        {"session_id": "eval", "kind": "eval", "env": "calc", "reward": 1.0, "group": 5},
        {"session_id": "x", "kind": "train", "env": "calc", "reward": None, "failed": True},
    ]
    write_jsonl(tmp_path / "episodes.jsonl", rows)
    wanted = SftDataConfig(source="traces", runs=[str(tmp_path)], reward_min=1.0)
    (sample,) = traces_samples(wanted, vocab_size=100)
    (expected,) = assemble_trajectories(sessions["won"])
    assert sample.token_ids == expected.token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sample.loss_mask == expected.loss_mask == [0, 0, 0, 1, 1, 0, 1, 1]
    assert (sample.reward, sample.group_id) == (1.0, 4)
    anything = SftDataConfig(source="traces", runs=[str(tmp_path)], kind=None)
    assert len(traces_samples(anything, vocab_size=100)) == 3
    with pytest.raises(SftDataError, match="token id 10, beyond the model's vocabulary of 10"):
        traces_samples(anything, vocab_size=10)
    none = SftDataConfig(source="traces", runs=[str(tmp_path)], reward_min=2.0)
    with pytest.raises(SftDataError, match="passes the filters"):
        traces_samples(none, vocab_size=100)
    with pytest.raises(SftDataError, match="no episodes.jsonl"):
        traces_samples(SftDataConfig(source="traces", runs=[str(tmp_path / "no")]), 100)
    (tmp_path / "traces.sqlite").unlink()
    with pytest.raises(SftDataError, match="has no traces.sqlite"):
        traces_samples(anything, vocab_size=100)
