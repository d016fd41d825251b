"""`verifiers`: an installed verifiers environment (single-turn, multi-turn or tools) played
through the gateway session by its own rollout logic, rewarded by its own rubric.

The environment is loaded once by id with its arguments (`verifiers.load_environment(env.id,
**env.args)`, which imports the installed module of that name and calls its
`load_environment`). Each episode is `env.rollout(row, client, ...)` on one dataset row, its
client the official openai SDK on the session's OpenAI base URL with retries off (the engine
pool retries: an SDK retry would record a turn twice), then `env.rubric.score_rollout`: the
reward is the rubric's, its metrics are the episode's (`env/NAME`). An error verifiers records
in the rollout (the model's, a tool's, the environment's own) fails the episode with it, as
does anything the environment raises; the rollout's own time limit scores as verifiers scores
a timed-out rollout.

`dataset.generate = "env"` takes the rows of the environment's dataset (`train`) or its eval
dataset (`eval`): all of them, or `num_tasks` after verifiers' shuffle by `seed`. An environment
without an eval dataset is refused for `eval` rather than scored on its training rows.

Targets verifiers 0.3.1 (the `verifiers` extra pins it), whose `Environment` API
(`load_environment`, `rollout`, `Rubric`) the environments published for it are written
against. 0.4.0 replaced that API (`verifiers.v1`: tasksets run by a harness in a subprocess it
prepares with uv, which fetches its dependencies from PyPI at every start, and whose SDK client
retries failed model calls) and caps openai below 3.
"""

from __future__ import annotations

import json
import math

from tracerl.config.base import ConfigError
from tracerl.config.envs import VerifiersEnvConfig
from tracerl.envs.adapters import missing_extra
from tracerl.envs.base import EnvResult, Session, Task, sampling_params
from tracerl.envs.chat import openai_client


class VerifiersEnvironment:
    name = "verifiers"
    task_fields: tuple[str, ...] = ("prompt",)
    reward_fn = None  # the rubric scores every rollout

    def __init__(self, config: VerifiersEnvConfig) -> None:
        try:
            import verifiers
        except ImportError as e:
            raise missing_extra("verifiers", "verifiers", e) from None
        self.config = config
        self.vf = verifiers
        try:
            self.env = verifiers.load_environment(config.id, **config.args)
        except ValueError as e:  # verifiers' "could not import" for an id not installed
            raise ConfigError(f"env.id: {e}") from None
        except (RuntimeError, TypeError) as e:  # its load_environment failed (on env.args?)
            raise ConfigError(f"env.args: {e}") from None

    def tasks(self, split: str, num_tasks: int | None, seed: int) -> list[Task]:
        """The rows of the environment's dataset (`train`) or eval dataset (`eval`), as JSON."""
        if split not in ("train", "eval"):
            raise ConfigError(
                f"dataset.split: a verifiers environment has train and eval, not {split!r}"
            )
        n, shuffle = (num_tasks, seed) if num_tasks else (-1, None)
        if split == "eval":
            self.env.build_eval_dataset()
            if self.env.eval_dataset is None:
                raise ConfigError(
                    f"eval_dataset: the verifiers environment {self.config.id!r} has no eval "
                    "dataset (verifiers would score its training rows as held out); set "
                    "eval_dataset.path to rows of your own"
                )
            rows = self.env.get_eval_dataset(n=n, seed=shuffle)
        else:
            rows = self.env.get_dataset(n=n, seed=shuffle)
        tasks: list[Task] = []
        for number, row in enumerate(rows, 1):
            try:
                tasks.append(json.loads(json.dumps(dict(row))))
            except TypeError as e:
                raise ConfigError(
                    f"{self.config.id} {split} row {number}: not JSON ({e}); tracerl keeps tasks "
                    "as JSON objects"
                ) from None
        return tasks

    async def run(self, task: Task, session: Session) -> EnvResult:
        c = self.config
        sampling = sampling_params(c.sampling.model_dump(), session)
        async with openai_client(session, c.request_timeout_s) as sdk:
            client = self.vf.OpenAIChatCompletionsClient(sdk)
            state = await self.env.rollout(
                input=task, client=client, model=session.model, sampling_args=sampling
            )
            error = state.get("error")
            if error is not None:
                raise RuntimeError(f"verifiers {c.id}: {describe(error)}")
            await self.env.rubric.score_rollout(state)
        reward = state.get("reward")
        if not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ValueError(f"verifiers {c.id}: the rubric gave no reward ({reward!r})")
        metrics = {
            str(k): float(v)
            for k, v in (state.get("metrics") or {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        metrics["truncated"] = float(bool(state.get("is_truncated")))
        return EnvResult(float(reward), metrics)


def describe(error: BaseException) -> str:
    """An error and what caused it, as `ModelError <- BadRequestError: Error code: 400 - ...`
    (verifiers wraps the SDK's error in one of its own with no message)."""
    parts: list[str] = []
    cause: BaseException | None = error
    while cause is not None and len(parts) < 4:
        parts.append(f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__)
        cause = cause.__cause__
    return " <- ".join(parts)
