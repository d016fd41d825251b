"""Demonstrated turns: an environment's scripted policy played through a real gateway with the
official openai SDK. The engine is never asked; the turns are recorded like sampled ones, with
the chat template's tokens for each reply, and a demonstration the chat format would misread
is refused with nothing recorded."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tracerl.envs import Session, make_environment, run_episode
from tracerl.envs.chat import tool_call
from tracerl.trace.schema import SessionTrace

FILES_TASK = {
    "prompt": "Find the passcode.",
    "answer": 4821,
    "files": [
        {"path": "docs/todo.txt", "text": "Order 5512 shipped on Monday."},
        {"path": "mail/passcode.txt", "text": "passcode: 4821"},
        {"path": "work/list.txt", "text": "Ticket 9001 was closed."},
    ],
}


async def demo_session(gw: Any) -> Session:
    return Session.from_gateway(await gw.open_session(), demonstration=True)


@pytest.mark.parametrize(
    ("env", "task", "turns"),
    [
        ("calculator", {"prompt": "What is 347 * 29 + 18?", "answer": 10081}, 2),
        ("guess", {"prompt": "Find it", "answer": 11, "high": 16}, 3),  # 8, 12, 10, 11
        ("calculator-single", {"prompt": "What is (347 - 18) * 29?", "answer": 9541}, 3),
        ("files", FILES_TASK, 5),  # list the top, docs, mail; read mail/passcode.txt; answer
    ],
)
async def test_a_scripted_policy_is_recorded_as_one_trajectory_of_its_replies(
    fake_engine, make_gateway, env: str, task: dict[str, Any], turns: int
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    single = env == "calculator-single"
    config = {"name": "calculator", "single_operation": True} if single else {"name": env}
    environment = make_environment({**config, "max_turns": 8})
    session = await demo_session(gw)
    result = await run_episode(environment, task, session, timeout_s=30)
    assert (result.reward, result.failed) == (1.0, False)
    assert fake.requests == []  # the engine never generated
    trace = SessionTrace.model_validate(await gw.trace(session.session_id))
    assert all(t.demonstration for t in trace.turns)
    assert len(trace.turns) == (4 if env == "guess" else turns)
    (trajectory,) = trace.trajectories
    renderer = gw.gateway.renderer
    sampled = [
        renderer.decode([i])
        for i, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True)
        if m
    ]
    text = "".join(sampled)
    if single:  # one operation per call, the second on the first's result
        assert text == (
            '<tool_call>\n{"name": "calculate", "arguments": {"expression": "347 - 18"}}'
            '\n</tool_call><|im_end|><tool_call>\n{"name": "calculate", "arguments": '
            '{"expression": "329 * 29"}}\n</tool_call><|im_end|>The answer is 9541.<|im_end|>'
        )
    elif env == "calculator":
        assert text == (
            '<tool_call>\n{"name": "calculate", "arguments": {"expression": "347 * 29 + 18"}}'
            "\n</tool_call><|im_end|>The answer is 10081.<|im_end|>"
        )
    elif env == "files":
        assert text.endswith("The passcode is 4821.<|im_end|>")
        assert [t.response["choices"][0]["message"].get("tool_calls", [{}])[0].get("function")
                for t in trace.turns[:4]] == [
            {"name": "list_files", "arguments": '{"path": "/"}'},
            {"name": "list_files", "arguments": '{"path": "docs"}'},
            {"name": "list_files", "arguments": '{"path": "mail"}'},
            {"name": "read_file", "arguments": '{"path": "mail/passcode.txt"}'},
        ]  # fmt: skip
    else:
        assert [t.response["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
                for t in trace.turns] == [
            '{"number": 8}', '{"number": 12}', '{"number": 10}', '{"number": 11}'
        ]  # fmt: skip
    # tool results are context only; every demonstrated token has log-prob 0.0
    assert "<tool_response>" not in text
    assert all(lp == 0.0 for lp in trajectory.logprobs)


async def test_a_demonstration_the_format_would_misread_is_refused_and_not_recorded(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    session = await demo_session(gw)
    client = openai.AsyncOpenAI(
        base_url=session.openai_base_url, api_key=session.api_key, max_retries=0
    )
    messages: Any = [{"role": "user", "content": "Add 2 and 3."}]
    # text that Hermes parsing takes for a call: the model could not be understood saying it
    call = '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'
    misread = {"role": "assistant", "content": call}
    tools: Any = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="tiny", messages=messages, tools=tools, extra_body={"demonstration": misread}
        )
    assert "demonstration" in str(refused.value)
    with pytest.raises(openai.BadRequestError, match="stream false"):
        await client.chat.completions.create(
            model="tiny", messages=messages, stream=True,
            extra_body={"demonstration": {"content": "5"}},
        )  # fmt: skip
    ok = await client.chat.completions.create(
        model="tiny", messages=messages, tools=tools,
        extra_body={"demonstration": tool_call("add", {"a": 2, "b": 3})},
    )  # fmt: skip
    await client.close()
    assert ok.choices[0].message.tool_calls[0].function.arguments == '{"a": 2, "b": 3}'
    trace = await gw.trace(session.session_id)
    assert [t["demonstration"] for t in trace["turns"]] == [True]
    assert fake.requests == []


async def test_rl_episodes_with_demonstrated_turns_fail(fake_engine, make_gateway) -> None:
    """An agent of its own that sends demonstrations in an RL episode: the episode fails with
    the reason, since nothing it recorded was sampled."""
    from tracerl.run.rollouts import EpisodeRunner

    _, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "calculator"})
    runner = EpisodeRunner(env, [gw.url], gw.gateway.admin_key, gw.store, timeout_s=30)
    task = {"prompt": "What is 2 * 3?", "answer": 6}
    try:
        demo = await runner.run(task, 0, "demo", {})
        assert demo.ok and demo.result.reward == 1.0
        runner.env = _Demonstrating(env)  # type: ignore[assignment]
        rl = await runner.run(task, 1, "train", {})
    finally:
        await runner.close()
    assert rl.result.failed and "demonstrated turns" in (rl.result.reason or "")
    assert not rl.samples


class _Demonstrating:
    """Plays the calculator with its scripted policy whatever the session says."""

    def __init__(self, env: Any) -> None:
        self.env, self.name, self.reward_fn = env, env.name, env.reward_fn
        self.task_fields = env.task_fields

    async def run(self, task: Any, session: Session) -> Any:
        from dataclasses import replace

        return await self.env.run(task, replace(session, demonstration=True))
