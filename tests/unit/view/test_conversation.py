"""Turns shown as conversations: tool calls and their results as such, whichever API."""

from __future__ import annotations

from tests.viewer_run import ANTHROPIC_REQUEST, TOOL_REQUEST
from tracerl.view.conversation import Part, request_messages, response_messages


def test_openai_tool_call_and_result() -> None:
    messages = request_messages(TOOL_REQUEST)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tools"]
    assert messages[1].parts == [
        Part("tool_call", '{\n "expression": "2+3"\n}', "calculate (call_1)")
    ]
    assert messages[2].parts == [Part("tool_result", "5", "call_1")]
    assert messages[3].parts == [Part("other", "calculate")]


def test_anthropic_blocks() -> None:
    messages = request_messages(ANTHROPIC_REQUEST)
    assert [m.role for m in messages] == ["system", "user", "assistant", "user"]
    assert (
        messages[2].parts[0].kind == "tool_call" and messages[2].parts[0].label == "add (toolu_1)"
    )
    assert messages[3].parts == [Part("tool_result", "3", "toolu_1")]
    reply = response_messages({"role": "assistant", "content": [{"type": "text", "text": "3"}]})
    assert reply[0].parts == [Part("text", "3")]


def test_responses_items_and_unknown_shapes() -> None:
    request = {"instructions": "hi", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "function_call", "name": "f", "arguments": "not json", "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "r"},
    ]}  # fmt: skip
    roles = [(m.role, m.parts[0].kind) for m in request_messages(request)]
    assert roles == [("system", "text"), ("user", "text"), ("assistant", "tool_call"),
                     ("tool", "tool_result")]  # fmt: skip
    assert response_messages({"weird": 1})[0].parts[0].kind == "other"
    assert request_messages({"input": "plain"})[0].parts == [Part("text", "plain")]
