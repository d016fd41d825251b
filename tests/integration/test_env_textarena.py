"""`textarena` against a real gateway in front of the scripted fake engine, with the real
TextArena package: a game played turn by turn as one trajectory, its reward recomputed here by
TextArena alone from the recorded replies, and failures that stay in their episode."""

from __future__ import annotations

import itertools
import random

import pytest

from tests.fakes import sampled_only
from tests.integration.test_envs import open_session
from tracerl.config.base import ConfigError
from tracerl.envs import make_environment, run_episode
from tracerl.trace.schema import SessionTrace

textarena = pytest.importorskip("textarena")

GUESS = {"name": "textarena", "game": "GuessTheNumber-v0", "max_turns": 8}


def hidden_number(seed: int) -> int:
    env = textarena.make("GuessTheNumber-v0")
    env.reset(num_players=1, seed=seed)
    while hasattr(env, "env"):
        env = env.env
    return int(env.state.game_state["game_number"])


def textarena_reward(game: str, seed: int, moves: list[str]) -> object:
    """TextArena alone: the moves played in a new game, and its reward for player 0."""
    env = textarena.make(game)
    env.reset(num_players=1, seed=seed)
    for move in moves:
        if env.step(move)[0]:
            break
    rewards, _ = env.close()
    return None if rewards is None else rewards[0]


def binary_search(target: int) -> list[str]:
    low, high, moves = 1, 20, []
    while True:
        guess = (low + high) // 2
        moves.append(f"I guess [{guess}]")
        if guess == target:
            return moves
        low, high = (guess + 1, high) if target > guess else (low, guess - 1)


async def test_a_game_is_one_trajectory_and_its_reward_is_textarenas(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment(GUESS)
    task = env.tasks("train", 1, 0)[0]
    moves = binary_search(hidden_number(task["seed"]))
    assert len(moves) >= 3
    fake.say(*moves, "never requested")
    session = await open_session(gw)
    result = await run_episode(env, task, session, timeout_s=30)
    assert (result.reward, result.failed) == (1.0, False)
    assert result.metrics == {"turns": len(moves), "unfinished": 0.0, "invalid_move": 0.0}
    raw = await gw.trace(session.session_id)
    turns = raw["turns"]
    assert len(turns) == len(moves) == len(fake.requests)  # every model call a recorded turn
    first = turns[0]["request"]["messages"]
    assert first[0]["role"] == "system" and "game player" in first[0]["content"]
    assert "Guess The Number" in first[1]["content"]
    # each later user turn is what the game said about the move before it (less the game's
    # echo of the move, which the assistant turn holds)
    for before, after in itertools.pairwise(turns):
        said = after["request"]["messages"][-1]["content"]
        assert before["response"]["choices"][0]["message"]["content"] not in said
        assert said.startswith("[GAME] The target number is")
        assert said.endswith(("higher.", "lower."))
    sampled_only(raw)  # one trajectory; the game's text is never trained on
    recorded = [t["response"]["choices"][0]["message"]["content"] for t in turns]
    assert textarena_reward("GuessTheNumber-v0", task["seed"], recorded) == 1
    assert env.reward_fn is not None
    assert env.reward_fn(task, SessionTrace.model_validate(raw)) == 1.0


async def test_an_unfinished_game_scores_zero_and_a_bad_reward_fails_alone(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    short = make_environment({**GUESS, "max_turns": 2})
    task = short.tasks("train", 1, 0)[0]
    target = hidden_number(task["seed"])
    wrong = [f"[{n}]" for n in range(1, 21) if n != target][:2]
    fake.say(*wrong)
    unfinished = await run_episode(short, task, await open_session(gw), timeout_s=30)
    assert (unfinished.reward, unfinished.failed) == (0.0, False)
    assert unfinished.metrics["unfinished"] == 1.0
    assert textarena_reward("GuessTheNumber-v0", task["seed"], wrong) is None  # not over

    # Countdown puts its error message where the reward goes after two invalid moves: that
    # episode fails with it, and the next one on the same gateway plays on
    countdown = make_environment({"name": "textarena", "game": "Countdown-v0"})
    fake.say("hello", "hello again")
    failed = await run_episode(countdown, {"seed": 3}, await open_session(gw), timeout_s=30)
    assert isinstance(textarena_reward("Countdown-v0", 3, ["hello", "hello again"]), str)
    assert failed.failed and failed.reason is not None
    assert "ValueError: TextArena's Countdown-v0 ended with a reward that is not a number" in (
        failed.reason
    )
    fake.say(*binary_search(target))
    won = await run_episode(make_environment(GUESS), task, await open_session(gw), timeout_s=30)
    assert (won.reward, won.failed) == (1.0, False)


def test_each_game_keeps_its_own_random_state() -> None:
    """2048 draws new tiles from Python's global random as it goes: two games played in turns
    see what each sees alone, and the process's own random is left as it was."""
    from tracerl.envs.adapters.textarena import Game

    def alone(seed: int) -> list[str]:
        game = Game("2048-v0", seed)
        seen = [game.observe()]
        for move in "wasd":
            game.move(f"[{move}]")
            seen.append(game.observe())
        return seen

    expected = alone(5), alone(6)
    random.seed(1234)
    before = random.getstate()
    games = Game("2048-v0", 5), Game("2048-v0", 6)
    seen: tuple[list[str], list[str]] = ([games[0].observe()], [games[1].observe()])
    for move in "wasd":
        for game, log in zip(games, seen, strict=True):
            game.move(f"[{move}]")
            log.append(game.observe())
    assert seen == expected
    assert random.getstate() == before


def test_settings_are_checked_and_tasks_are_seeded(monkeypatch) -> None:
    with pytest.raises(ConfigError, match="env.game: TextArena has no game 'Chess-v9'"):
        make_environment({"name": "textarena", "game": "Chess-v9"})
    env = make_environment(GUESS)
    train, held_out = env.tasks("train", 50, 0), env.tasks("eval", 50, 0)
    assert train == env.tasks("train", 50, 0)
    assert not {t["seed"] for t in train} & {t["seed"] for t in held_out}
    assert len(env.tasks("eval", None, 0)) == 50
    import sys

    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(ConfigError, match=r"pip install 'tracerl\[textarena\]'"):
        make_environment(GUESS)
