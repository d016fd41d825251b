"""`guess`, the stateful game, against a real gateway in front of the scripted fake engine, as
the loop runs it: what the model is told depends on what it guessed, the episode is one
trajectory, and the game's answers are never in the loss."""

from __future__ import annotations

from tests.fakes import sampled_only, shown_between
from tests.integration.test_envs import open_session
from tracerl.envs import make_environment, run_episode
from tracerl.envs.guess import HIGHS, answer_guess, generate_tasks
from tracerl.trace.schema import SessionTrace

GUESS = '<tool_call>\n{{"name": "guess", "arguments": {{"number": {}}}}}\n</tool_call>'
TASK = {"prompt": "I am thinking of a whole number from 1 to 16.", "answer": 11, "high": 16}


async def test_a_binary_search_finds_the_number_in_one_trajectory(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "guess", "max_turns": 6})
    fake.say(GUESS.format(8), GUESS.format(12), GUESS.format(10), GUESS.format(11))
    session = await open_session(gw)
    result = await run_episode(env, TASK, session, timeout_s=30)
    assert (result.reward, result.failed) == (1.0, False)
    assert result.metrics == {"turns": 4.0, "guesses": 4.0, "invalid_guesses": 0.0, "solved": 1.0}
    assert len(fake.requests) == 4  # a correct guess ends the episode: no fifth model turn
    trace = await gw.trace(session.session_id)
    turns = trace["turns"]
    assert [t["parent"] for t in turns] == [None, 0, 1, 2]
    # the game's answers, in order, depend on the guesses: each is context the next turn sees
    answers = shown_between(turns, fake.tokenizer)
    assert ["higher" in answers[0], "lower" in answers[1], "higher" in answers[2]] == [True] * 3
    # 1 exactly on the sampled tokens: the answers are never trained on
    trajectory = sampled_only(trace)
    assert sum(trajectory["loss_mask"]) == sum(len(t["completion_ids"]) for t in turns)
    # the recorded episode scores the same without the game (an external agent's trace)
    assert env.reward_fn is not None
    assert env.reward_fn(TASK, SessionTrace.model_validate(trace)) == 1.0


async def test_invalid_guesses_and_the_turn_limit_score_zero(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "guess", "max_turns": 3})
    fake.say(GUESS.format(40), GUESS.format('"seven"'), GUESS.format(3), "never requested")
    session = await open_session(gw)
    result = await run_episode(env, TASK, session, timeout_s=30)
    assert result.reward == 0.0
    assert result.metrics == {"turns": 3.0, "guesses": 3.0, "invalid_guesses": 2.0, "solved": 0.0}
    assert env.reward_fn is not None
    assert (
        env.reward_fn(TASK, SessionTrace.model_validate(await gw.trace(session.session_id))) == 0.0
    )
    assert len(fake.requests) == 3
    t0, t1, _ = (await gw.trace(session.session_id))["turns"]
    tail = fake.tokenizer.decode(t1["prompt_ids"][len(t0["prompt_ids"]) :])
    assert "error: the number is from 1 to 16" in tail


async def test_a_final_answer_without_the_tool_is_scored_by_its_number(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "guess"})
    fake.say(GUESS.format(8), "It must be 11.", GUESS.format(8), "It is 9.")
    right = await run_episode(env, TASK, await open_session(gw), timeout_s=30)
    wrong = await run_episode(env, TASK, await open_session(gw), timeout_s=30)
    assert (right.reward, right.metrics["solved"]) == (1.0, 1.0)
    assert (wrong.reward, wrong.metrics["solved"]) == (0.0, 0.0)


def test_the_game_answers_by_the_hidden_number() -> None:
    assert answer_guess(TASK, "guess", '{"number": 5}') == ("higher", False)
    assert answer_guess(TASK, "guess", '{"number": "14"}') == ("lower", False)  # quoted: a guess
    assert answer_guess(TASK, "guess", '{"number": 11}') == ("correct: the number is 11", True)
    for name, args in (("shout", "{}"), ("guess", "{oops"), ("guess", '{"number": 2.5}'),
                       ("guess", '{"number": true}'), ("guess", '{"number": 0}')):  # fmt: skip
        content, found = answer_guess(TASK, name, args)
        assert found is None and content.startswith("error:"), (name, args)


def test_task_sets_are_seeded_and_held_out_sets_differ() -> None:
    train, again, held_out = generate_tasks(50, 0), generate_tasks(50, 0), generate_tasks(50, 1)
    assert train == again and train != held_out
    for task in train:
        assert task["high"] in HIGHS and 1 <= task["answer"] <= task["high"]
        assert f"from 1 to {task['high']}" in task["prompt"]
    assert {t["high"] for t in train} == set(HIGHS)
