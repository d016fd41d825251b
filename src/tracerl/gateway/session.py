"""Per-session state for prefix reuse: which token ids each recorded turn ended with.

A new request continues a recorded turn when its rendered prompt text starts with that turn's
exact text (rendered prompt + sampled completion). The prompt's ids are then that turn's
`prompt_ids + completion_ids` followed by the tokens of the new text only, so a multi-turn
episode trains on exactly the tokens the model sampled, and the cost of a turn does not grow with
the context. Assistant messages the client echoes back are rendered with the model's raw output
(tool-call markup as sampled), which is what makes the texts line up.

`forced_call_of` gives the prefix and schema of a tool call the request forces, `constrain`
picks the JSON schema the engine enforces on the reply, `fit_budget` fits a request's token
budget into the context its prompt leaves, and a `PendingTurn` is what recording the request's
turn will need.

The state lives in memory; after a gateway restart a session's next turn starts a new trajectory
(its earlier turns stay recorded).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tracerl.gateway.api import ANY_TOOL, ApiRequest, Dialect
from tracerl.gateway.messages import BadRequest, canonical_assistant
from tracerl.gateway.render import ChatRenderer, ForcedCall, forced_call

# Recorded turns searched for a prefix, newest first; older ones are forks too far back to matter.
MAX_PARENT_CANDIDATES = 64


@dataclass
class RecordedTurn:
    index: int
    text: str
    ids: list[int]


@dataclass
class SessionState:
    session_id: str
    key_hash: str
    system_prompt: str | None = None
    closed: bool = False
    traceparent: str | None = None
    """The episode's trace context (W3C), parent of its request spans (telemetry on)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    next_index: int = 0
    # Only the candidates `plan_prompt` searches are kept: each holds its whole context's text
    # and ids, so keeping every turn would grow a long session's memory quadratically.
    recorded: deque[RecordedTurn] = field(
        default_factory=lambda: deque(maxlen=MAX_PARENT_CANDIDATES)
    )
    raw_assistant: dict[str, str] = field(default_factory=dict)

    def remember(self, turn: RecordedTurn, returned: dict[str, Any], raw_text: str) -> None:
        self.recorded.append(turn)
        self.raw_assistant[canonical_assistant(returned)] = raw_text


@dataclass
class Prompt:
    text: str
    ids: list[int]
    parent: int | None


@dataclass
class PromptPlan:
    """A rendered prompt whose new part still has to be tokenized (`Prompt` once it is)."""

    text: str
    reused_ids: list[int]
    parent: int | None
    new_text: str

    def complete(self, new_ids: list[int]) -> Prompt:
        return Prompt(self.text, self.reused_ids + new_ids, self.parent)

    def then(self, text: str) -> PromptPlan:
        """This prompt followed by `text` (a forced reply's start: context, not sampled)."""
        return PromptPlan(self.text + text, self.reused_ids, self.parent, self.new_text + text)


def with_system_prompt(
    messages: list[dict[str, Any]], system_prompt: str | None
) -> list[dict[str, Any]]:
    """Prepend the configured system prompt (to an existing system message, or as a new one)."""
    if not system_prompt:
        return messages
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{system_prompt}\n\n{messages[0]['content']}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": system_prompt}, *messages]


def plan_prompt(
    renderer: ChatRenderer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    state: SessionState | None,
) -> PromptPlan:
    """Render the prompt and find the recorded turn it extends; only the rest needs tokenizing."""
    if state is not None:
        messages = with_system_prompt(messages, state.system_prompt)
        messages = [_as_sampled(m, state.raw_assistant) for m in messages]
    text = renderer.render(messages, tools)
    if state is not None:
        for turn in reversed(state.recorded):
            if text.startswith(turn.text):
                return PromptPlan(text, turn.ids, turn.index, text[len(turn.text) :])
    return PromptPlan(text, [], None, text)


def _as_sampled(message: dict[str, Any], raw: dict[str, str]) -> dict[str, Any]:
    if message["role"] != "assistant":
        return message
    sampled = raw.get(canonical_assistant(message))
    if sampled is None:
        return message
    return {"role": "assistant", "content": sampled}


def fit_budget(
    parsed: ApiRequest, prompt_tokens: int, max_model_len: int | None, policy: str
) -> bool:
    """Cap (or reject, `policy`) a token budget beyond the room the context leaves after the
    prompt; errors name the caller's fields. True when the budget was capped."""
    if max_model_len is None:
        return False
    room = max_model_len - prompt_tokens
    if room < 1:
        raise BadRequest(
            "messages" if parsed.max_tokens_param != "max_output_tokens" else "input",
            f"the prompt is {prompt_tokens} tokens; the model's context is "
            f"{max_model_len} tokens, which leaves no room for a reply",
        )
    asked = parsed.spec.max_new_tokens
    if asked is None or asked <= room:
        return False
    if policy == "reject":
        raise BadRequest(
            parsed.max_tokens_param,
            f"{asked} tokens do not fit: the prompt is {prompt_tokens} tokens of the "
            f"model's {max_model_len}-token context, which leaves {room}",
        )
    parsed.spec.max_new_tokens = room
    return True


def forced_call_of(parsed: ApiRequest) -> ForcedCall | None:
    """The forced call a `tool_choice` that requires one asks for, None otherwise."""
    if parsed.forced_tool is None:
        return None
    name = None if parsed.forced_tool == ANY_TOOL else parsed.forced_tool
    return forced_call(name, parsed.tools)


def constrain(parsed: ApiRequest, forced: ForcedCall | None) -> str | None:
    """Set the JSON schema the engine must enforce on the reply (`spec.json_schema`) and return
    the caller's field it came from, for an engine's refusal of it; None when nothing is
    enforced. A forced call's schema comes first. A structured-output format is enforced
    unless the model may call tools on this turn: an engine's constraint covers the whole
    reply, so it would rule out the call the caller allowed."""
    if forced is not None:
        parsed.spec.json_schema = json.dumps(forced.schema)
        return "tools"
    if parsed.output_schema is not None and not parsed.tools:
        parsed.spec.json_schema = json.dumps(parsed.output_schema)
        return parsed.output_schema_param
    return None


@dataclass(frozen=True)
class PendingTurn:
    """One generation request, parsed, before its reply: what recording its turn needs."""

    dialect: Dialect
    state: SessionState | None
    """Its session; None: untraced (admin-key evals)."""
    body: dict[str, Any]
    parsed: ApiRequest
    prompt: Prompt
    rid: str
    forced: str = ""
    """A forced tool call's prefix, at the end of the prompt (context, not sampled)."""
