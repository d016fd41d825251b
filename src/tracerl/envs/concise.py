"""`concise`: answer a question in at most N words; the format task chosen for SmolLM2-135M on CPU.

Why this task. It has to be partly right at the start (so GRPO groups are not all zero) and
learnable within 20-40 small steps. Sampling SmolLM2-135M-Instruct at temperature 1 with at most
48 new tokens, 8 questions x 4 samples per instruction (measured when choosing):

    "... Answer in at most 10 words."                    28 % comply, word counts 1 to 43
    "... Answer with exactly one word in lowercase."     12 % comply
    "... Wrap your final answer in <answer></answer> tags."  0 % comply

Only the word limit is partly followed, and its replies spread widely in length, so a graded
reward separates every group: 1.0 for 1..N words, N / words above (43 words -> 0.23), 0.0 for an
empty reply. On this module's generated questions ("Describe a volcano." ...) the first 8 x 4
samples (at most 40 new tokens) scored a mean 0.56, 12 % fully within the limit. Length is a
direction the policy can move in a few steps, unlike a tag format it never samples.

Task fields: `prompt` (the question) and optional `max_words` (default 10); the environment
appends the instruction itself.
"""

from __future__ import annotations

import random

from tracerl.config.envs import ConciseEnvConfig
from tracerl.envs.base import Task
from tracerl.envs.chat import SingleTurnEnvironment
from tracerl.envs.rewards import DEFAULT_MAX_WORDS, concise_reward

_TEMPLATES = (
    "What is a {}?",
    "Describe a {}.",
    "Why are {}s useful?",
    "Where would you find a {}?",
    "Tell me about a {}.",
    "How does a {} work?",
)
_SUBJECTS = (
    "bicycle", "volcano", "library", "river", "telescope", "honeybee", "piano", "desert", "bridge",
    "glacier", "computer", "forest", "lighthouse", "camera", "garden", "train", "comet", "castle",
    "dolphin", "windmill", "clock", "mountain", "rainbow", "museum", "compass", "satellite",
    "tortoise", "harbor", "candle", "cactus", "violin", "tornado", "map", "kite", "ladder", "owl",
)  # fmt: skip


def generate_tasks(num_tasks: int, seed: int) -> list[Task]:
    """`num_tasks` open questions (216 distinct ones, repeated past that), seeded."""
    rng = random.Random(f"tracerl.concise:{seed}")
    return [
        {
            "prompt": rng.choice(_TEMPLATES).format(rng.choice(_SUBJECTS)),
            "max_words": DEFAULT_MAX_WORDS,
        }
        for _ in range(num_tasks)
    ]


class ConciseEnvironment(SingleTurnEnvironment):
    name = "concise"
    task_fields = ("prompt",)

    def __init__(self, config: ConciseEnvConfig) -> None:
        super().__init__(config, concise_reward)

    def prompt(self, task: Task) -> str:
        limit = int(task.get("max_words", DEFAULT_MAX_WORDS))
        return f"{task['prompt']} Answer in at most {limit} words."
