"""`textarena`: a single-player TextArena game as a multi-turn episode, the game's observations
as user turns and the model's replies as its moves, the game's own reward.

Each episode makes the game (`textarena.make`, with TextArena's default wrappers for the id it
is given), resets it with the task's `seed` for one player, and then, until the game is done or
`env.max_turns` model turns have passed: what the game said since the last move becomes a user
message (the first one holds the rules), the reply goes back to the game as its move, exactly as
the model wrote it (TextArena's own action wrapper reads it). The messages grow by appending
only, so the gateway records the episode as one trajectory; the game's text is context, never
trained on. The reward is TextArena's for player 0 when the game ends (`env.close()`); a game
still running after `max_turns` scores 0 (`unfinished` 1). A game that ends with a reward that
is not a number (some games return their error message there) fails the episode with it.

Observations: with TextArena's default wrappers an observation is the whole game so far, and
its new part is sent, less the game's echo of the move (`[Player] <the reply>`: the assistant
turn before holds it); with a `-raw` id it is a list of new messages, sent less the echo too.

TextArena reseeds Python's global `random` on reset and draws from it as the game goes: each
game here keeps a random state of its own, swapped in around every call into it (calls into
the game never await), so concurrent episodes do not disturb one another, a seed plays the
same game every time, and the process's own `random` is left as it was.

`dataset.generate = "env"` makes tasks `{"seed": N}` (a task may also name its own `game`).
Tested with textarena 0.7.4 (the `textarena` extra pins it); its word games need nltk data that
cannot be downloaded here, and some games need an API key (both fail when made, naming it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tracerl.config.base import ConfigError
from tracerl.config.envs import TextArenaEnvConfig
from tracerl.envs.adapters import missing_extra, seeded_tasks
from tracerl.envs.base import EnvResult, Session, Task, TraceReward, sampling_params, turn_seed
from tracerl.envs.chat import openai_client
from tracerl.trace.schema import SessionTrace

T = TypeVar("T")


class Game:
    """One TextArena game for one player, with a random state of its own."""

    def __init__(self, game_id: str, seed: int) -> None:
        import textarena

        self._random = random.Random(seed).getstate()
        self.env = self._call(textarena.make, game_id)
        self._call(self.env.reset, num_players=1, seed=seed)
        self.seen = ""  # the whole-history observation read so far (default wrappers)
        self.last_move: str | None = None

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        outer = random.getstate()
        random.setstate(self._random)
        try:
            return fn(*args, **kwargs)
        finally:
            self._random = random.getstate()
            random.setstate(outer)

    def observe(self) -> str:
        """What the game said since the last move."""
        _, observation = self._call(self.env.get_observation)
        if isinstance(observation, str):
            if observation.startswith(self.seen):
                new = observation[len(self.seen) :].strip()
            else:  # a wrapper that does not append: the whole observation is new
                new = observation.strip()
            self.seen = observation
            move = self.last_move
            for echo in () if move is None else (f"[Player] {move}", f"[Player] [{move}]"):
                if new.startswith(echo + "\n"):  # the game repeating the move it was sent
                    return new[len(echo) :].strip()
            return new
        from textarena.core import ObservationType

        return "\n".join(
            str(text) for _, text, kind in observation if kind != ObservationType.PLAYER_ACTION
        ).strip()

    def move(self, action: str) -> bool:
        """Play `action`; True when the game is over."""
        self.last_move = action
        done, _ = self._call(self.env.step, action)
        return bool(done)

    def close(self) -> tuple[Any, dict[Any, Any]]:
        """TextArena's (rewards by player or None when unfinished, game info by player)."""
        rewards, info = self._call(self.env.close)
        return rewards, info or {}


def final_reward(game_id: str, rewards: Any, info: dict[Any, Any]) -> tuple[float, bool]:
    """Player 0's reward and whether the game finished; a reward that is not a number fails."""
    if rewards is None:
        return 0.0, False
    value = rewards.get(0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        reason = (info.get(0) or {}).get("reason")
        raise ValueError(
            f"TextArena's {game_id} ended with a reward that is not a number: {value!r}"
            + (f" (the game's reason: {reason})" if reason else "")
        )
    return float(value), True


class TextArenaEnvironment:
    name = "textarena"
    task_fields: tuple[str, ...] = ("seed",)

    def __init__(self, config: TextArenaEnvConfig) -> None:
        try:
            import textarena
        except ImportError as e:
            raise missing_extra("textarena", "textarena", e) from None
        if config.game not in textarena.envs.registration.ENV_REGISTRY:
            raise ConfigError(f"env.game: TextArena has no game {config.game!r}")
        if config.system_prompt is None:
            from textarena.agents.basic_agents import STANDARD_GAME_PROMPT

            config = config.model_copy(update={"system_prompt": STANDARD_GAME_PROMPT})
        if config.system_prompt == "":
            config = config.model_copy(update={"system_prompt": None})
        self.config = config
        self.reward_fn: TraceReward = self.trace_reward

    def game_of(self, task: Task) -> str:
        return str(task.get("game") or self.config.game)

    def tasks(self, split: str, num_tasks: int | None, seed: int) -> list[Task]:
        return seeded_tasks(self.name, split, num_tasks, seed)

    async def run(self, task: Task, session: Session) -> EnvResult:
        c = self.config
        game_id = self.game_of(task)
        game = Game(game_id, int(task["seed"]))
        sampling = sampling_params(c.sampling.model_dump(), session)
        messages: list[Any] = []
        if c.system_prompt is not None:
            messages.append({"role": "system", "content": c.system_prompt})
        turns, done = 0, False
        async with openai_client(session, c.request_timeout_s) as client:
            while not done and turns < c.max_turns:
                messages.append({"role": "user", "content": game.observe()})
                reply = await client.chat.completions.create(
                    model=session.model, messages=messages, **turn_seed(sampling, turns)
                )
                turns += 1
                move = reply.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": move})
                done = game.move(move)
        rewards, info = game.close()
        reward, finished = final_reward(game_id, rewards, info)
        player = info.get(0) or {}
        metrics = {
            "turns": float(turns),
            "unfinished": float(not finished),
            "invalid_move": float(bool(player.get("invalid_move"))),
        }
        return EnvResult(reward, metrics)

    def replay(self, task: Task, moves: Sequence[str]) -> float:
        """The reward of playing `moves` in the task's game from its start (the game over, or
        the moves or `max_turns` spent)."""
        game_id = self.game_of(task)
        game = Game(game_id, int(task["seed"]))
        for turn, move in enumerate(moves):
            if turn >= self.config.max_turns or game.move(move):
                break
        return final_reward(game_id, *game.close())[0]

    def trace_reward(self, task: Task, trace: SessionTrace) -> float:
        """The game's reward for a recorded episode: its replies replayed in a new game."""
        moves = [
            turn.response["choices"][0]["message"].get("content") or ""
            for turn in trace.turns
            if turn.endpoint == "chat.completions"
        ]
        return self.replay(task, moves)
