"""The strict SDK-model validator of `tests/sdk_models.py` (used by the stream conformance
check): it accepts conforming objects and rejects a wrong type, an unknown event type, a bad
literal and an undeclared field, so the conformance check can fail."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests import sdk_models

GOOD_CHUNK = {
    "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
    "choices": [{"index": 0, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": None}],
}  # fmt: skip
GOOD_RESPONSES_EVENT = {
    "type": "response.output_item.added", "output_index": 0, "sequence_number": 2,
    "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f",
             "arguments": "", "status": "in_progress"},
}  # fmt: skip
GOOD_MESSAGES_EVENT = {
    "type": "content_block_start", "index": 0,
    "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
}  # fmt: skip
GOOD_MESSAGE = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
    "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
    "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1},
}  # fmt: skip


def _with(value: dict[str, Any], path: str, new: Any) -> dict[str, Any]:
    """`value` with the field at dotted `path` (list indices as numbers) set to `new`."""
    out = copy.deepcopy(value)
    *parents, last = path.split(".")
    holder: Any = out
    for key in parents:
        holder = holder[int(key)] if isinstance(holder, list) else holder[key]
    holder[last] = new
    return out


@pytest.mark.parametrize(
    ("validate", "good"),
    [
        (sdk_models.chat_chunk, GOOD_CHUNK),
        (sdk_models.responses_event, GOOD_RESPONSES_EVENT),
        (sdk_models.messages_event, GOOD_MESSAGES_EVENT),
        (sdk_models.message, GOOD_MESSAGE),
        (sdk_models.chat_chunk, _with(GOOD_CHUNK, "choices.0.delta.reasoning_content", "r")),
    ],
    ids=["chunk", "responses", "messages", "message", "allowed-extra"],
)
def test_the_validator_accepts_conforming_objects(validate: Any, good: Any) -> None:
    validate(good)


REJECTED = [
    pytest.param(sdk_models.chat_chunk, "created", "1", "created", id="chunk-wrong-type"),
    pytest.param(sdk_models.chat_chunk, "choices.0.finish_reason", "done", "finish", id="literal"),
    pytest.param(sdk_models.chat_chunk, "choices.0.delta.tool", "x", "['tool']", id="chunk-extra"),
    # allowed on a delta (ALLOWED_EXTRA), not anywhere else
    pytest.param(
        sdk_models.chat_chunk, "reasoning_content", "r", "['reasoning_content']", id="misplaced"
    ),
    pytest.param(
        sdk_models.responses_event, "type", "response.nope", "unknown event type", id="unknown"
    ),
    pytest.param(sdk_models.responses_event, "item.arguments", {}, "arguments", id="responses"),
    pytest.param(sdk_models.responses_event, "item.status", "done", "status", id="status"),
    pytest.param(
        sdk_models.responses_event, "item.input", "{}",
        "ResponseFunctionToolCall does not declare ['input']", id="responses-extra",
    ),
    pytest.param(sdk_models.messages_event, "content_block.input", "{}", "input", id="messages"),
    pytest.param(
        sdk_models.messages_event, "content_block.arguments", {},
        "ToolUseBlock does not declare ['arguments']", id="messages-extra",
    ),
    pytest.param(
        sdk_models.message, "usage.tokens", 4, "Usage does not declare ['tokens']", id="body"
    ),
]  # fmt: skip
GOOD: dict[Any, dict[str, Any]] = {
    sdk_models.chat_chunk: GOOD_CHUNK,
    sdk_models.responses_event: GOOD_RESPONSES_EVENT,
    sdk_models.messages_event: GOOD_MESSAGES_EVENT,
    sdk_models.message: GOOD_MESSAGE,
}


@pytest.mark.parametrize(("validate", "path", "value", "says"), REJECTED)
def test_the_validator_rejects_what_the_sdk_models_do_not_declare(
    validate: Any, path: str, value: Any, says: str
) -> None:
    # a conforming object with one field wrong
    with pytest.raises(sdk_models.SdkModelError) as caught:
        validate(_with(GOOD[validate], path, value))
    assert says in str(caught.value), caught.value
