"""Each chat format: detected from its family's template, parsing its calls and reasoning (cut
replies and malformed markup included), and a forced call's prefix parsing back to the call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chat_families import family_tokenizer
from tracerl.formats import detect, format_for
from tracerl.formats.json_calls import nine_char_id
from tracerl.gateway.render import ChatRenderer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
            },
        },
    }
]


@pytest.mark.parametrize(
    ("family", "name"),
    [
        ("qwen3", "hermes"),
        ("qwen3.5", "qwen3_coder"),
        ("deepseek-v3.1", "deepseek"),
        ("glm-4.7", "glm"),
        ("llama3", "llama3"),
        ("mistral", "mistral"),
        ("harmony", "harmony"),
    ],
)
def test_the_format_is_read_from_the_family_template(family: str, name: str) -> None:
    assert detect(family_tokenizer(family).chat_template) == name


def test_smollm2_and_the_built_in_templates_are_hermes(tiny) -> None:
    from tracerl.chat_templates import CHATML, GEMMA

    _, tokenizer = tiny
    assert {detect(t) for t in (tokenizer.chat_template, CHATML, GEMMA)} == {"hermes"}
    assert format_for(tokenizer.chat_template).think is None
    assert format_for(family_tokenizer("qwen3").chat_template).think == ("<think>", "</think>")


def test_an_unknown_format_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'chatml2' is not a chat format"):
        format_for("", "chatml2")


CASES: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]], str | None]] = [
    # format, reply, content, calls, reasoning
    (
        "hermes",
        '<think>\nhm\n</think>\n\nOK <tool_call>\n{"name": "search", "arguments": {"q": "a"}}\n'
        "</tool_call>",
        "OK",
        [("search", {"q": "a"})],
        "hm",
    ),
    (
        "qwen3_coder",
        "hm\n</think>\n\nLet me look.\n<tool_call>\n<function=search>\n<parameter=q>\n"
        "1984\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>",
        "Let me look.",
        [("search", {"q": "1984", "n": 3})],  # q is a string by its schema, n an integer
        "hm",
    ),
    (
        "glm",
        "<think>hm</think>Sure.<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>a b"
        "</arg_value>\n<arg_key>n</arg_key><arg_value>2</arg_value></tool_call>",
        "Sure.",
        [("search", {"q": "a b", "n": 2})],
        "hm",
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "search", "parameters": {"q": "a"}}; '
        '{"name": "search", "parameters": {"q": "b"}}',
        "",
        [("search", {"q": "a"}), ("search", {"q": "b"})],
        None,
    ),
    ("llama3", '{"answer": 4}', '{"answer": 4}', [], None),  # JSON, not a call: text
    (
        "mistral",
        '[TOOL_CALLS][{"name": "search", "arguments": {"q": "a"}}, {"name": "search", '
        '"arguments": {"q": "b"}}]',
        "",
        [("search", {"q": "a"}), ("search", {"q": "b"})],
        None,
    ),
    (
        "mistral",
        '[THINK]hm[/THINK]Two.[TOOL_CALLS]search[ARGS]{"q": "a"}[TOOL_CALLS]search[ARGS]{"q": "b"}',
        "Two.",
        [("search", {"q": "a"}), ("search", {"q": "b"})],
        "hm",
    ),
    (
        "deepseek",
        'Hi<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{"q": "a"}'
        '<｜tool▁call▁end｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{"q": "b"}<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>",
        "Hi",
        [("search", {"q": "a"}), ("search", {"q": "b"})],
        None,
    ),
    (
        "deepseek",  # V3's layout
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n"
        '```json\n{"q": "a"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        [("search", {"q": "a"})],
        None,
    ),
    (
        "harmony",
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.search <|constrain|>json<|message|>{"q": "a"}<|call|>',
        "",
        [("search", {"q": "a"})],
        "hm",
    ),
    (
        "harmony",
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>4",
        "4",
        [],
        "hm",
    ),
]


@pytest.mark.parametrize(("name", "reply", "content", "calls", "reasoning"), CASES)
def test_replies_parse_into_content_calls_and_reasoning(
    name: str, reply: str, content: str, calls: list[Any], reasoning: str | None
) -> None:
    fmt = format_for("", name)
    if name == "hermes":
        fmt = format_for("<think>", name)
    out = fmt.parse(reply, tools=TOOLS)
    assert out.content == content
    assert [(c.name, c.arguments) for c in out.tool_calls] == calls
    assert out.reasoning == reasoning


@pytest.mark.parametrize(
    ("name", "reply"),
    [
        ("qwen3_coder", "<tool_call>\n<function=search>\n<parameter=q>\nab"),  # no </function>
        ("glm", "<tool_call>not a name<arg_key>q</arg_key></tool_call>"),
        (
            "deepseek",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{oops}"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        ("mistral", "[TOOL_CALLS]search[ARGS]{oops"),
        ("llama3", '{"name": "search", "parameters": {"q": '),
    ],
)
def test_malformed_calls_stay_text(name: str, reply: str) -> None:
    out = format_for("", name).parse(reply, tools=TOOLS)
    assert out.tool_calls == [] and out.content == reply.strip()


@pytest.mark.parametrize(
    ("name", "reply"),
    [
        ("deepseek", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{"q": "ab'),
        ("mistral", '[TOOL_CALLS]search[ARGS]{"q": "ab'),
        ("llama3", '{"name": "search", "parameters": {"q": "ab'),
        (
            "harmony",
            '<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"q": "ab',
        ),
    ],
)
def test_a_call_the_budget_cut_is_a_call_in_progress(name: str, reply: str) -> None:
    (call,) = format_for("", name).parse(reply, cut=True, tools=TOOLS).tool_calls
    assert call.name == "search" and call.partial is not None
    assert call.arguments_json.startswith('{"q": "ab') and call.arguments == {}


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("hermes", '{"q": "x", "n": 1}}'),
        ("llama3", '{"q": "x", "n": 1}}'),
        ("mistral", '{"q": "x", "n": 1}}]'),
        ("deepseek", '{"q": "x", "n": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
        ("harmony", '{"q": "x", "n": 1}'),
        (
            "qwen3_coder",
            "<parameter=q>\nx\n</parameter>\n<parameter=n>\n1\n</parameter>\n"
            "</function>\n</tool_call>",
        ),
        (
            "glm",
            "<arg_key>q</arg_key><arg_value>x</arg_value><arg_key>n</arg_key>"
            "<arg_value>1</arg_value></tool_call>",
        ),
    ],
)
def test_a_forced_call_prefix_and_its_sampled_rest_parse_to_the_call(
    name: str, arguments: str
) -> None:
    fmt = format_for("", name)
    forced = fmt.forced_call("search", TOOLS)
    if forced.schema is not None:  # a JSON body: the engine holds the arguments to the schema
        assert forced.schema["properties"] == TOOLS[0]["function"]["parameters"]["properties"]
    (call,) = fmt.parse(forced.prefix + arguments, tools=TOOLS).tool_calls
    assert (call.name, call.arguments) == ("search", {"q": "x", "n": 1})


def test_mistral_call_ids_become_nine_characters_its_template_accepts() -> None:
    renderer = ChatRenderer(family_tokenizer("mistral"))
    call = {"id": "call_0123456789abcdef", "type": "function",
            "function": {"name": "search", "arguments": {"q": "a"}}}  # fmt: skip
    messages = [
        {"role": "user", "content": "find a"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0123456789abcdef", "content": "found"},
    ]
    text = renderer.render(messages, TOOLS)  # the template raises on any other id
    assert '[TOOL_CALLS]search[ARGS]{"q": "a"}' in text
    short = nine_char_id("call_0123456789abcdef")
    assert len(short) == 9 and short.isalnum() and short == nine_char_id("call_0123456789abcdef")
    assert nine_char_id("abcDEF123") == "abcDEF123"


def test_deepseek_gets_its_tool_list_and_arguments_as_text() -> None:
    renderer = ChatRenderer(family_tokenizer("deepseek-v3.1"))
    assert not renderer.native_tools  # its template renders no tool list
    call = {"id": "c1", "type": "function",
            "function": {"name": "search", "arguments": {"q": "a"}}}  # fmt: skip
    text = renderer.render(
        [{"role": "user", "content": "find a"},
         {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "tool_call_id": "c1", "content": "found"}],
        TOOLS,
    )  # fmt: skip
    assert "## Tools" in text and "### search" in text
    assert f"search<｜tool▁sep｜>{json.dumps({'q': 'a'})}<｜tool▁call▁end｜>" in text
