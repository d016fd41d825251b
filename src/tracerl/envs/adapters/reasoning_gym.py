"""`reasoning-gym`: any of reasoning-gym's procedural task generators as the dataset, its own
verifier as the reward.

An episode is one chat turn through the gateway: reasoning-gym's system prompt (asking for the
answer inside `<answer>...</answer>`), the generated question, and the reply scored by the
dataset's `score_answer` on the answer reasoning-gym's `extract_answer` reads from it. A task is
reasoning-gym's entry as it made it (`question`, `answer`, `metadata`), so a JSONL of entries
works as `dataset.path` too, and the trace alone scores an episode again (`reward_fn`).

`dataset.generate = "env"` asks the generator for a split's tasks: the split's name is part of
its seed (`train` uses `dataset.seed` itself), so `train` and `eval` are different draws of the
same generator. A generator with a small space of questions can still repeat one across them.
The environment's scripted policy answers with the entry's own answer in the asked-for form:
a cold start (`[cold_start]`) teaches a small model the answer tag before RL.

Tested with reasoning-gym 0.1.25 (the `reasoning-gym` extra pins it).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from tracerl.config.base import ConfigError
from tracerl.config.envs import ReasoningGymEnvConfig
from tracerl.envs.adapters import missing_extra
from tracerl.envs.base import Task
from tracerl.envs.chat import SingleTurnEnvironment

TRAIN_TASKS = 1000  # the train split's size when dataset.num_tasks is unset


class ReasoningGymEnvironment(SingleTurnEnvironment):
    name = "reasoning-gym"
    demonstrable = True  # `script` answers in demonstration sessions
    task_fields: tuple[str, ...] = ("question",)  # some generators store no answer

    def __init__(self, config: ReasoningGymEnvConfig) -> None:
        try:
            from reasoning_gym.utils import SYSTEM_PROMPTS
        except ImportError as e:
            raise missing_extra("reasoning-gym", "reasoning-gym", e) from None
        if config.system_prompt is None:
            if config.prompt_style not in SYSTEM_PROMPTS:
                raise ConfigError(
                    f"env.prompt_style: reasoning-gym has no system prompt {config.prompt_style!r}"
                    f"; choose one of {sorted(SYSTEM_PROMPTS)} or set env.system_prompt"
                )
            system = SYSTEM_PROMPTS[config.prompt_style]
            config = config.model_copy(update={"system_prompt": system})
        if config.system_prompt == "":
            config = config.model_copy(update={"system_prompt": None})
        # One small instance scores every task: the generator's settings are checked here,
        # before any episode, and an entry carries what its scoring needs in `metadata`.
        self.rg_config = config
        self.scorer = self._generator(config, size=1, seed=0)
        super().__init__(config, self.score)

    @staticmethod
    def _generator(config: ReasoningGymEnvConfig, size: int, seed: int) -> Any:
        import reasoning_gym

        try:
            return reasoning_gym.create_dataset(config.dataset, size=size, seed=seed, **config.args)
        except (ValueError, TypeError, KeyError, AssertionError) as e:
            known = reasoning_gym.factory.DATASETS
            if config.dataset not in known:
                raise ConfigError(
                    f"env.dataset: reasoning-gym has no dataset {config.dataset!r} "
                    f"({len(known)} known, e.g. {', '.join(sorted(known)[:5])})"
                ) from None
            raise ConfigError(f"env.args: reasoning-gym's {config.dataset}: {e}") from None

    def prompt(self, task: Task) -> str:
        return str(task["question"])

    def script(self, task: Task) -> str:
        """The scripted policy: the generator's own answer in the asked-for form, what a cold
        start demonstrates (`[cold_start]`) to a model that does not use the tag yet."""
        if task.get("answer") is None:  # propositional_logic and a few others store none
            raise ValueError("this reasoning-gym task stores no answer to demonstrate")
        tag = self.rg_config.answer_tag
        return str(task["answer"]) if tag is None else f"<{tag}>{task['answer']}</{tag}>"

    def answer_of(self, text: str) -> str | None:
        """The answer reasoning-gym reads from a reply (None: the tag is missing)."""
        tag = self.rg_config.answer_tag
        if tag is None:
            return text.strip()
        from reasoning_gym.utils import extract_answer

        return extract_answer(text, tag_name=tag)

    def score(self, task: Task, text: str) -> float:
        """The generator's own verdict on the reply (reasoning-gym's `score_answer`, 0 to 1)."""
        entry = {"question": task["question"], "answer": task.get("answer")}
        entry["metadata"] = task.get("metadata") or {}
        return float(self.scorer.score_answer(self.answer_of(text), entry))

    def tasks(self, split: str, num_tasks: int | None, seed: int) -> list[Task]:
        """`num_tasks` entries of the generator (default 1000 for `train`, `env.eval_tasks`
        otherwise), seeded by `seed` and the split's name, as JSON objects."""
        size = num_tasks or (TRAIN_TASKS if split == "train" else self.rg_config.eval_tasks)
        split_seed = seed if split == "train" else zlib.crc32(f"{split}:{seed}".encode())
        generator = self._generator(self.rg_config, size=size, seed=split_seed)
        # a JSON round trip: entries hold tuples and the like, tasks are JSON objects
        return [json.loads(json.dumps(entry, default=_jsonable)) for entry in generator]


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"a reasoning-gym entry holds {type(value).__name__}, which JSON cannot hold")
