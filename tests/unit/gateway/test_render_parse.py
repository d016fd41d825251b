import json

import pytest

from tracerl.formats.hermes import Hermes, hermes_messages, parse_output, streamable_prefix
from tracerl.gateway.messages import (
    BadRequest,
    anthropic_messages,
    canonical_assistant,
    openai_messages,
)
from tracerl.gateway.render import ChatRenderer

TOOL = {
    "type": "function",
    "function": {"name": "add", "description": "sum", "parameters": {"type": "object"}},
}


def test_hermes_fallback_renders_tools_calls_and_results(tiny) -> None:
    _, tokenizer = tiny
    renderer = ChatRenderer(tokenizer)
    assert not renderer.native_tools  # SmolLM2's template ignores `tools`
    messages = [
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 1, "b": 2}},
                }
            ],
        },
        {"role": "tool", "content": "3", "tool_call_id": "c1"},
    ]
    text = renderer.render(messages, [TOOL])
    assert text.startswith("<|im_start|>system\n# Tools")
    assert f"<tools>\n{json.dumps(TOOL)}\n</tools>" in text
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in text
    assert "<|im_start|>tool\n<tool_response>\n3\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_existing_system_message_gets_the_tool_list_appended() -> None:
    out = hermes_messages([{"role": "system", "content": "Be nice."}], [TOOL])
    assert out[0]["content"].startswith("Be nice.\n\n# Tools")


def test_parse_tool_calls_and_keep_malformed_text() -> None:
    text = (
        'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
        "<tool_call>{not json}</tool_call>"
    )
    out = parse_output(text)
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("add", {"a": 1})]
    assert out.content == "Sure.\n\n<tool_call>{not json}</tool_call>"
    assert parse_output('<tool_call>{"arguments": {}}</tool_call>').tool_calls == []
    string_args = parse_output('<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>')
    assert string_args.tool_calls[0].arguments == {"x": 2}
    # a call that drops its last closing brace (SmolLM2 does after a forced prefix) is read
    short = parse_output('<tool_call>\n{"name": "f", "arguments": {"x": {"y": 1}}\n</tool_call>')
    assert [(c.name, c.arguments) for c in short.tool_calls] == [("f", {"x": {"y": 1}})]
    assert (
        parse_output('<tool_call>{"name": "f", "arguments": {"x": [1</tool_call>').tool_calls == []
    )
    # a last call without its closing tag (a forced call ends with its schema's value) is read;
    # one that is cut short stays text, and so does an unclosed call before a closed one
    unclosed = parse_output('Ok <tool_call>\n{"name": "f", "arguments": {"x": 1}')
    assert [(c.name, c.arguments) for c in unclosed.tool_calls] == [("f", {"x": 1})]
    assert unclosed.content == "Ok"
    cut = '<tool_call>\n{"name": "f", "argu'
    assert parse_output(cut).tool_calls == [] and parse_output(cut).content == cut
    both = parse_output(
        '<tool_call>{"name": "g"\n<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    )
    assert [c.name for c in both.tool_calls] == []


def test_reasoning_is_split_only_when_the_template_has_it() -> None:
    text = "<think>plan</think>\nanswer"
    assert Hermes(thinking=True).parse(text).reasoning == "plan"
    assert Hermes(thinking=True).parse(text).content == "answer"
    assert Hermes(thinking=False).parse(text).content == text


@pytest.mark.parametrize(
    ("partial", "safe"),
    [
        ("Hello", "Hello"),
        ("Hello <tool", "Hello"),
        ("Hi\n<tool_call>{", "Hi"),
        ("word ", "word"),
        ("<", ""),
    ],
)
def test_streamable_prefix_holds_back_possible_calls(partial: str, safe: str) -> None:
    assert streamable_prefix(partial) == safe


def test_openai_and_anthropic_messages_normalise_alike() -> None:
    oai = openai_messages(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "sys"}]},
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"x": 1}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "a", "content": "r"},
            ]
        }
    )
    ant = anthropic_messages(
        {
            "system": "sys",
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "b", "name": "f", "input": {"x": 1}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "b",
                            "content": [{"type": "text", "text": "r"}],
                        }
                    ],
                },
            ],
        }
    )
    assert (
        [m["role"] for m in oai]
        == [m["role"] for m in ant]
        == ["system", "user", "assistant", "tool"]
    )
    assert canonical_assistant(oai[2]) == canonical_assistant(ant[2])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": "",
                        # text is read as far as it goes (a cut call echoed back); a list is
                        # neither an object nor its text
                        "tool_calls": [{"function": {"name": "f", "arguments": [1, 2]}}],
                    }
                ]
            },
            "messages.0.tool_calls.0.arguments",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content.0",
        ),
    ],
)
def test_openai_message_errors_name_the_field(body, param) -> None:
    with pytest.raises(BadRequest) as err:
        openai_messages(body)
    assert err.value.param == param


def test_anthropic_images_are_rejected_clearly() -> None:
    with pytest.raises(BadRequest, match="no vision"):
        anthropic_messages(
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}
        )


def test_fast_rendering_and_tokenizing_match_the_tokenizer(tiny) -> None:
    _, tokenizer = tiny
    renderer = ChatRenderer(tokenizer)
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Grüße 🚀 <b>"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "again"},
    ]
    text = renderer.render(messages, [])
    assert text == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert renderer.tokenize(text) == tokenizer(text, add_special_tokens=False)["input_ids"]
