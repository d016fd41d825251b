"""The openai SDK client every built-in environment uses, the single-turn chat environment, and
the turn loop of the tool-using ones (`play_with_tools`).

Clients are `openai.AsyncOpenAI` with `max_retries=0` (the engine pool retries a failed engine
request; an SDK retry would send the turn again and record it twice) and an explicit timeout.
One client per episode, closed when the episode ends: episodes share nothing but the gateway.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai

from tracerl.config.envs import ChatEnvConfig
from tracerl.envs.base import (
    EnvResult,
    Session,
    Task,
    TraceReward,
    sampling_params,
    turn_seed,
)
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


def function_tool(
    name: str, description: str, parameter: str, kind: str, parameter_description: str
) -> Any:
    """An openai function tool of one required parameter (`kind`: its JSON schema type), in
    the key order transformers' `get_json_schema` writes, so TRL renders it alike. Typed Any:
    the SDK's name for this TypedDict differs across the openai versions we accept."""
    spec = {"type": kind, "description": parameter_description}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {parameter: spec},
                "required": [parameter],
            },
        },
    }


def call_arguments(tools: str | tuple[str, ...], name: str, arguments: str) -> dict[str, Any] | str:
    """A call of one of `tools` (a name, or several): its arguments as an object ({} when they
    are JSON but not an object), or the error its tool message gives back (another tool, not
    JSON)."""
    if isinstance(tools, str):
        tools = (tools,)
    if name not in tools:
        known = " and ".join(tools)
        where = f"the only tool is {known}" if len(tools) == 1 else f"the tools are {known}"
        return f"error: unknown tool {name!r}; {where}"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return "error: the arguments are not valid JSON"
    return args if isinstance(args, dict) else {}


@dataclass
class ToolPlay:
    """How a tool-using episode ended: after `turns` model turns, with the final reply's text
    (None when a tool answer ended it, or the turns ran out: `turn_limit`)."""

    turns: int
    final_text: str | None
    turn_limit: bool


Script = Callable[[list[Any]], dict[str, Any]]
"""A scripted policy: the messages so far -> the assistant message it demonstrates."""


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant message making one function call (what a scripted policy demonstrates)."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    call = {"id": "call_0", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


ToolAnswer = Callable[[str | None, str], str | None]
"""A call's answer: (function name, None for a call of another type; its arguments) -> the tool
message's content, or None to end the episode on this call."""


async def play_with_tools(
    session: Session,
    config: ChatEnvConfig,
    prompt: str,
    tools: list[Any],
    max_turns: int,
    answer: ToolAnswer,
    script: Script | None = None,
) -> ToolPlay:
    """The turns of a tool-using episode through the official openai SDK: every reply with tool
    calls gets one `tool` message per call (`answer`'s), until a reply without calls or
    `max_turns` model turns. Assistant messages go back exactly as the SDK returned them, so the
    gateway records the episode as one trajectory. In a demonstration session every reply is
    `script`'s, sent as the request's `demonstration`."""
    if session.demonstration and script is None:
        raise ValueError("this environment has no scripted policy to demonstrate")
    sampling = sampling_params(config.sampling.model_dump(), session)
    messages = first_messages(config, prompt)
    turns = 0
    async with openai_client(session, config.request_timeout_s) as client:
        while turns < max_turns:
            extra = None
            if session.demonstration and script is not None:
                extra = {"demonstration": script(messages)}
            reply = await client.chat.completions.create(
                model=session.model,
                messages=messages,
                tools=tools,
                extra_body=extra,
                **turn_seed(sampling, turns),
            )
            turns += 1
            message = reply.choices[0].message
            if not message.tool_calls:
                return ToolPlay(turns, message.content or "", False)
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                function = call.function if call.type == "function" else None
                content = answer(
                    function.name if function else None, function.arguments if function else ""
                )
                if content is None:
                    return ToolPlay(turns, None, False)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return ToolPlay(turns, None, True)


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

    def script(self, task: Task) -> str:
        """The scripted policy's reply (an environment with `demonstrable = True` has one)."""
        raise ValueError(f"the {self.name} environment has no scripted policy to demonstrate")

    async def run(self, task: Task, session: Session) -> EnvResult:
        sampling = sampling_params(self.config.sampling.model_dump(), session)
        extra = None
        if session.demonstration:
            extra = {"demonstration": {"role": "assistant", "content": self.script(task)}}
        async with openai_client(session, self.config.request_timeout_s) as client:
            reply = await client.chat.completions.create(
                model=session.model,
                messages=first_messages(self.config, self.prompt(task)),
                extra_body=extra,
                **sampling,
            )
        choice = reply.choices[0]
        text = choice.message.content or ""
        metrics = {
            "reply_words": float(count_words(text)),
            "truncated": float(choice.finish_reason == "length"),
        }
        return EnvResult(self.text_reward(task, text), metrics)
