"""An OpenEnv environment of the tests' own (openenv-core 0.3.0), served with
`uvicorn openenv_tracerl_toy:app` from this folder: find a number from 1 to 16, told "higher"
or "lower" after each reply (its first whole number is the guess); reward 1 on finding it, minus
0.125 for every wrong guess before, given when the game ends (found, or 4 guesses).
`TOY_MAX_ENVS` sets the server's sessions at once (default 8); a reply "explode" raises."""

from __future__ import annotations

import os
import random
import re
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

HIGH, GUESSES = 16, 4


class Reply(Action):
    message: str


class Said(Observation):
    text: str = ""


class Game(State):
    secret: int = 0


class GuessGame(Environment[Reply, Said, Game]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = Game(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Said:
        self._state = Game(episode_id=episode_id, step_count=0)
        self._state.secret = random.Random(seed).randint(1, HIGH)
        return Said(text=f"Find my number from 1 to {HIGH}. Reply with a guess.")

    def step(self, action: Reply, timeout_s: float | None = None, **_: Any) -> Said:
        if action.message.strip() == "explode":
            raise RuntimeError("the game exploded")
        game = self._state
        game.step_count += 1
        found = re.search(r"\d+", action.message)
        guess = int(found.group()) if found else 0
        if guess == game.secret:
            return Said(text="correct", done=True, reward=1.0 - 0.125 * (game.step_count - 1))
        text = "higher" if guess < game.secret else "lower"
        if game.step_count >= GUESSES:
            return Said(text=text, done=True, reward=0.0)
        return Said(text=text)

    @property
    def state(self) -> Game:
        return self._state


app = create_app(
    GuessGame, Reply, Said, env_name="tracerl_toy",
    max_concurrent_envs=int(os.environ.get("TOY_MAX_ENVS", "8")),
)  # fmt: skip
