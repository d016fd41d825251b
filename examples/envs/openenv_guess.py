"""An OpenEnv environment server (openenv-core 0.3.0) for examples/envs/openenv.toml, which
starts it (`uvicorn openenv_guess:app` in this folder): find a number from 1 to 16 in 5
guesses, told whether it is larger or smaller after each (a reply's first whole number is its
guess); reward 1 on finding it, 0.2 less for each wrong guess before."""

from __future__ import annotations

import os
import random
import re
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

HIGH, GUESSES = 16, 5


class Guess(Action):
    message: str


class Hint(Observation):
    text: str = ""


class Game(State):
    secret: int = 0


class GuessGame(Environment[Guess, Hint, Game]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = Game(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Hint:
        self._state = Game(episode_id=episode_id, step_count=0)
        self._state.secret = random.Random(seed).randint(1, HIGH)
        return Hint(
            text=f"Guess the whole number I am thinking of, from 1 to {HIGH}, in at most "
            f"{GUESSES} tries. Reply with just your guess, for example: 8"
        )

    def step(self, action: Guess, timeout_s: float | None = None, **_: Any) -> Hint:
        game = self._state
        game.step_count += 1
        found = re.search(r"\d+", action.message)
        guess = int(found.group()) if found else 0
        if guess == game.secret:
            return Hint(text="correct", done=True, reward=1.0 - 0.2 * (game.step_count - 1))
        hint = "larger" if guess < game.secret else "smaller"
        text = f"No: my number is {hint} than {guess}. Your next guess?"
        return Hint(text=text, done=game.step_count >= GUESSES, reward=0.0)

    @property
    def state(self) -> Game:
        return self._state


app = create_app(
    GuessGame, Guess, Hint, env_name="guess",
    max_concurrent_envs=int(os.environ.get("GUESS_SESSIONS", "64")),
)  # fmt: skip
