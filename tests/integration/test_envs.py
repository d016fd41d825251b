"""The built-in environments against a real gateway in front of the scripted fake engine, over
real sockets with the official openai SDK, as the loop runs them (`run_episode`)."""

from __future__ import annotations

from typing import Any

from tests.fakes import two_turn_loss_mask
from tracerl.envs import Session, make_environment, run_episode
from tracerl.trace.schema import SessionTrace

TOOL_CALL = (
    '<tool_call>\n{{"name": "calculate", "arguments": {{"expression": "{}"}}}}\n</tool_call>'
)


async def open_session(gw: Any, **sampling: Any) -> Session:
    return Session.from_gateway(await gw.open_session(), sampling=sampling)


async def test_arithmetic_scores_the_exact_answer(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment(
        {"name": "arithmetic", "sampling": {"temperature": 0.7, "max_tokens": 32}}
    )
    task = {"prompt": "What is 17 + 25?", "answer": 42}
    fake.say("17 + 25 = 42", "It is 41.")
    right = await open_session(gw, temperature=0.3)  # the loop's temperature wins
    wrong = await open_session(gw)
    first = await run_episode(env, task, right, timeout_s=30)
    second = await run_episode(env, task, wrong, timeout_s=30)
    assert (first.reward, first.failed) == (1.0, False)
    assert (second.reward, second.failed) == (0.0, False)
    assert first.metrics == {"reply_words": 3.0, "truncated": 0.0}  # "+" and "=" are no words
    params = [r["sampling_params"] for r in fake.requests]
    assert [p["temperature"] for p in params] == [0.3, 0.7]
    assert [p["max_new_tokens"] for p in params] == [32, 32]
    raw = await gw.trace(right.session_id)
    (turn,) = raw["turns"]
    assert turn["request"]["messages"] == [{"role": "user", "content": "What is 17 + 25?"}]
    assert turn["response"]["choices"][0]["message"]["content"] == "17 + 25 = 42"
    # The trace reward reads the same text the environment scored.
    assert env.reward_fn is not None
    assert env.reward_fn(task, SessionTrace.model_validate(raw)) == 1.0


async def test_concise_appends_the_instruction_and_grades_length(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "concise", "system_prompt": "Be helpful."})
    task = {"prompt": "Describe a river.", "max_words": 10}
    fake.say("A river is flowing water.", " ".join(["water"] * 20))
    short = await run_episode(env, task, await open_session(gw), timeout_s=30)
    long_session = await open_session(gw)
    long = await run_episode(env, task, long_session, timeout_s=30)
    assert short.reward == 1.0
    assert long.reward == 0.5  # 10 allowed / 20 written
    (turn,) = (await gw.trace(long_session.session_id))["turns"]
    assert turn["request"]["messages"] == [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Describe a river. Answer in at most 10 words."},
    ]


async def test_calculator_tool_round_trip_is_one_trajectory(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "calculator", "max_turns": 3})
    task = {"prompt": "What is 347 * 29 + 18?", "answer": 10081}
    fake.say(TOOL_CALL.format("347 * 29 + 18"), "The answer is 10081.")
    session = await open_session(gw)
    result = await run_episode(env, task, session, timeout_s=30)
    assert (result.reward, result.failed) == (1.0, False)
    assert result.metrics == {
        "turns": 2.0,
        "tool_calls": 1.0,
        "tool_errors": 0.0,
        "turn_limit": 0.0,
    }
    trace = await gw.trace(session.session_id)
    t0, t1 = trace["turns"]
    assert t0["finish_reason"] == "tool_calls" and t1["parent"] == 0
    (traj,) = trace["trajectories"]
    assert traj["turn_indices"] == [0, 1]
    new_prompt = len(t1["prompt_ids"]) - len(t0["prompt_ids"]) - len(t0["completion_ids"])
    assert traj["loss_mask"] == two_turn_loss_mask(t0, t1)
    tail = fake.tokenizer.decode(t1["prompt_ids"][-new_prompt:])
    assert "<tool_response>\n10081\n</tool_response>" in tail  # 347*29 = 10063, + 18
    assert '"calculate"' in fake.tokenizer.decode(t0["prompt_ids"])  # the tool was offered


async def test_calculator_refuses_code_and_caps_the_turns(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "calculator", "max_turns": 2})
    task = {"prompt": "What is 2 + 2?", "answer": 4}
    fake.say(
        TOOL_CALL.format("__import__('os').system('touch pwned')"),
        TOOL_CALL.format("1 / 0"),
        "never requested",
    )
    session = await open_session(gw)
    result = await run_episode(env, task, session, timeout_s=30)
    assert (result.reward, result.failed) == (0.0, False)
    assert result.metrics == {
        "turns": 2.0,
        "tool_calls": 2.0,
        "tool_errors": 2.0,
        "turn_limit": 1.0,
    }
    assert len(fake.requests) == 2  # the cap: no third model turn
    t0, t1 = (await gw.trace(session.session_id))["turns"]
    tail = fake.tokenizer.decode(t1["prompt_ids"][len(t0["prompt_ids"]) :])
    assert "error: unsupported syntax: Call" in tail


async def test_calculator_credits_a_valid_tool_call_only_when_configured(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    task = {"prompt": "What is 347 * 29 + 18?", "answer": 10081}
    rewards = []
    for config, call in (
        ({"tool_use_reward": 0.2}, "347 * 29 + 18"),  # a valid call, then a wrong answer
        ({"tool_use_reward": 0.2}, "1 / 0"),  # only an invalid call: no credit
        ({}, "347 * 29 + 18"),  # the default is exact answers only
    ):
        env = make_environment({"name": "calculator", "max_turns": 3, **config})
        fake.say(TOOL_CALL.format(call), "The answer is 12.")
        result = await run_episode(env, task, await open_session(gw), timeout_s=30)
        rewards.append(result.reward)
    assert rewards == [0.2, 0.0, 0.0]


async def test_single_operation_calculator_takes_one_operation_per_call(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "calculator", "max_turns": 4, "single_operation": True})
    task = {"prompt": "What is 347 * 29 + 18?", "answer": 10081}
    fake.say(
        TOOL_CALL.format("347 * 29 + 18"),  # two operations in one call: refused
        TOOL_CALL.format("347 * 29"),
        TOOL_CALL.format("10063 + 18"),
        "The answer is 10081.",
    )
    session = await open_session(gw, seed=7)
    result = await run_episode(env, task, session, timeout_s=30)
    assert (result.reward, result.failed) == (1.0, False)
    assert result.metrics == {
        "turns": 4.0,
        "tool_calls": 3.0,
        "tool_errors": 1.0,
        "turn_limit": 0.0,
    }
    trace = await gw.trace(session.session_id)
    (traj,) = trace["trajectories"]
    assert traj["turn_indices"] == [0, 1, 2, 3]  # one trajectory over the four turns
    # a seeded episode's turns draw from seeds of their own, the first the episode's
    seeds = [turn["request"]["seed"] for turn in trace["turns"]]
    assert seeds[0] == 7 and len(set(seeds)) == 4
    last = fake.tokenizer.decode(trace["turns"][3]["prompt_ids"])
    assert "one operation per call" in last and "10063" in last and "10081" in last
    assert "one operation on two numbers" in last  # the single-operation tool was offered


async def test_an_answer_after_more_calls_than_the_task_allows_scores_nothing(
    fake_engine, make_gateway
) -> None:
    """`max_calls` (calculator-mixed): a right answer counts only within the question's calls."""
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "calculator", "max_turns": 4, "single_operation": True})
    task = {"prompt": "What is 347 * 29 + 18?", "answer": 10081, "max_calls": 2}
    two_calls = [TOOL_CALL.format("347 * 29"), TOOL_CALL.format("10063 + 18")]
    rewards = []
    for extra in ([], [TOOL_CALL.format("10063 + 18")]):  # the second repeats its last call
        fake.say(*two_calls, *extra, "The answer is 10081.")
        result = await run_episode(env, task, await open_session(gw), timeout_s=30)
        rewards.append((result.reward, result.metrics["tool_calls"]))
    assert rewards == [(1.0, 2.0), (0.0, 3.0)]


async def test_an_unreachable_gateway_is_a_failed_episode() -> None:
    env = make_environment({"name": "arithmetic", "request_timeout_s": 5})
    session = Session("s", "k", "http://127.0.0.1:9/s/s/v1", "http://127.0.0.1:9/s/s")
    result = await run_episode(env, {"prompt": "1 + 1?", "answer": 2}, session, timeout_s=30)
    assert result.failed and (result.reason or "").startswith("APIConnectionError: ")
