"""The openai SDK client every built-in environment uses, and the single-turn chat environment.

Clients are `openai.AsyncOpenAI` with `max_retries=0` (the engine pool retries a failed engine
request; an SDK retry would send the turn again and record it twice) and an explicit timeout.
One client per episode, closed when the episode ends: episodes share nothing but the gateway.
"""

from __future__ import annotations

from typing import Any

import openai

from tracerl.config.envs import ChatEnvConfig
from tracerl.envs.base import EnvResult, Session, Task, TraceReward, sampling_params
from tracerl.envs.rewards import TextReward, count_words, from_final_text


def openai_client(session: Session, timeout_s: float) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=session.openai_base_url,
        api_key=session.api_key,
        max_retries=0,
        timeout=timeout_s,
    )


def first_messages(config: ChatEnvConfig, user: str) -> list[Any]:
    """The opening messages: the configured system prompt, if any, and the user's text."""
    messages: list[Any] = []
    if config.system_prompt is not None:
        messages.append({"role": "system", "content": config.system_prompt})
    messages.append({"role": "user", "content": user})
    return messages


class SingleTurnEnvironment:
    """Ask once, score the reply's text: the shape of `arithmetic` and `concise`."""

    name = "single_turn"
    task_fields: tuple[str, ...] = ("prompt",)

    def __init__(self, config: ChatEnvConfig, reward: TextReward) -> None:
        self.config = config
        self.text_reward = reward
        self.reward_fn: TraceReward | None = from_final_text(reward)

    def prompt(self, task: Task) -> str:
        """The user message for `task`."""
        return str(task["prompt"])

    async def run(self, task: Task, session: Session) -> EnvResult:
        sampling = sampling_params(self.config.sampling.model_dump(), session)
        async with openai_client(session, self.config.request_timeout_s) as client:
            reply = await client.chat.completions.create(
                model=session.model,
                messages=first_messages(self.config, self.prompt(task)),
                **sampling,
            )
        choice = reply.choices[0]
        text = choice.message.content or ""
        metrics = {
            "reply_words": float(count_words(text)),
            "truncated": float(choice.finish_reason == "length"),
        }
        return EnvResult(self.text_reward(task, text), metrics)
