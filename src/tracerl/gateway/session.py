"""Per-session state for prefix reuse: which token ids each recorded turn ended with.

A new request continues a recorded turn when its rendered prompt text starts with that turn's
exact text (rendered prompt + sampled completion). The prompt's ids are then that turn's
`prompt_ids + completion_ids` followed by the tokens of the new text only, so a multi-turn
episode trains on exactly the tokens the model sampled, and the cost of a turn does not grow with
the context. Assistant messages the client echoes back are rendered with the model's raw output
(tool-call markup as sampled), which is what makes the texts line up.

Some templates rewrite history: Qwen3's and GLM's drop a reply's reasoning once a later user
message follows it, so the rendered conversation no longer starts with what was sampled. When
the messages before an echoed reply still render as that turn's prompt, the turn is bridged
(`gateway.history = "extend"`, the default): the new prompt is the turn's recorded tokens
followed by the template's rendering of what came after the reply (from the end-of-turn marker
after it, found by rendering the conversation with the reply replaced by a sentinel), so the
episode stays one trajectory and the model is given exactly what is recorded. With
`history = "template"` the prompt is rendered as the template does and starts a new trajectory.
Either way a turn that starts a new trajectory in a session with recorded turns says why
(`fork_reason`).

`forced_call_of` gives the prefix and schema of a tool call the request forces, `constrain`
picks the JSON schema the engine enforces on the reply, `fit_budget` fits a request's token
budget into the context its prompt leaves, a `PendingTurn` is what recording the request's
turn will need, and `commit_turn` records it.

The state lives in memory; after a gateway restart a session's next turn starts a new trajectory
(its earlier turns stay recorded).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tracerl.formats import ChatFormat, ForcedCall
from tracerl.gateway.api import ANY_TOOL, ApiRequest, Dialect, Outcome
from tracerl.gateway.generation import Completion
from tracerl.gateway.messages import BadRequest, canonical_assistant
from tracerl.gateway.render import ChatRenderer
from tracerl.routing import RoutedExperts
from tracerl.trace.schema import Turn

if TYPE_CHECKING:
    from tracerl.gateway.store import TraceStore

# Recorded turns searched for a prefix, newest first; older ones are forks too far back to matter.
MAX_PARENT_CANDIDATES = 64


@dataclass
class RecordedTurn:
    index: int
    text: str
    ids: list[int]
    prompt_chars: int = 0
    """Where the reply starts in `text` (a forced call's prefix belongs to the reply)."""
    template: str | None = None
    """The template's rendering of the messages before the reply, where the prompt is not it
    (a bridged prompt: the parent's text, then the new messages' rendering)."""
    key: str = ""
    """The reply as the API returned it (`canonical_assistant`), to know it when echoed."""

    @property
    def prompt(self) -> str:
        """The template's rendering of the messages before the reply."""
        return self.template if self.template is not None else self.text[: self.prompt_chars]


@dataclass
class SessionState:
    session_id: str
    key_hash: str
    system_prompt: str | None = None
    closed: bool = False
    traceparent: str | None = None
    """The episode's trace context (W3C), parent of its request spans (telemetry on)."""
    adapter: str | None = None
    """The LoRA adapter that samples its turns unless a request's `model` names another."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    next_index: int = 0
    # Only the candidates `plan_prompt` searches are kept: each holds its whole context's text
    # and ids, so keeping every turn would grow a long session's memory quadratically.
    recorded: deque[RecordedTurn] = field(
        default_factory=lambda: deque(maxlen=MAX_PARENT_CANDIDATES)
    )
    raw_assistant: dict[str, list[str]] = field(default_factory=dict)
    """Each reply as returned -> how the model sampled it, in the order recorded: replies
    alike as returned can differ as sampled (trailing whitespace the API strips)."""

    def remember(self, turn: RecordedTurn, returned: dict[str, Any], raw_text: str) -> None:
        """`turn` recorded, whose reply the API `returned` and the model sampled as `raw_text`
        (what an echo of it is rendered as)."""
        turn.key = canonical_assistant(returned)
        self.recorded.append(turn)
        self.raw_assistant.setdefault(turn.key, []).append(raw_text)


@dataclass
class Prompt:
    text: str
    ids: list[int]
    parent: int | None
    bridged: bool = False
    """It extends `parent` across a reply the template renders differently than sampled."""
    fork_reason: str | None = None
    """Why it starts a new trajectory although its session has recorded turns."""
    template: str | None = None
    """When bridged: the template's rendering, which `text` is not."""


@dataclass
class PromptPlan:
    """A rendered prompt whose new part still has to be tokenized (`Prompt` once it is)."""

    text: str
    reused_ids: list[int]
    parent: int | None
    new_text: str
    bridged: bool = False
    fork_reason: str | None = None
    template: str | None = None

    def complete(self, new_ids: list[int]) -> Prompt:
        return Prompt(
            self.text,
            self.reused_ids + new_ids,
            self.parent,
            self.bridged,
            self.fork_reason,
            self.template,
        )

    def then(self, text: str) -> PromptPlan:
        """This prompt followed by `text` (a forced reply's start: context, not sampled)."""
        return replace(self, text=self.text + text, new_text=self.new_text + text)


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


def rendered_messages(
    renderer: ChatRenderer, messages: list[dict[str, Any]], state: SessionState | None
) -> list[dict[str, Any]]:
    """A request's messages as its prompt is rendered from them: the session's system prompt
    first, and (formats that re-render replies as sampled) echoed replies as sampled."""
    if state is None:
        return messages
    messages = with_system_prompt(messages, state.system_prompt)
    if renderer.format.echo_raw:
        messages = _as_sampled(messages, state.raw_assistant)
    return messages


def plan_prompt(
    renderer: ChatRenderer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    state: SessionState | None,
    history: str = "extend",
    turn_ends: tuple[str, ...] = (),
) -> PromptPlan:
    """Render the prompt and find the recorded turn it extends; only the rest needs tokenizing.
    `history`: extend (bridge) or fork at a reply the template re-renders differently;
    `turn_ends`: the texts of the model's end-of-turn tokens."""
    echoed = with_system_prompt(messages, state.system_prompt) if state else messages
    messages = rendered_messages(renderer, messages, state)
    text = renderer.render(messages, tools)
    if state is None or not state.recorded:
        return PromptPlan(text, [], None, text)
    for recorded in reversed(state.recorded):
        if text.startswith(recorded.text):
            return PromptPlan(text, recorded.ids, recorded.index, text[len(recorded.text) :])
    found = _rewritten_turn(renderer, echoed, messages, tools, state)
    if found is None:
        why = "its history is not a recorded turn's prompt and reply"
        return PromptPlan(text, [], None, text, fork_reason=why)
    turn, at = found
    why = f"the chat template renders turn {turn.index}'s reply differently than it was sampled"
    if history == "template":
        return PromptPlan(text, [], None, text, fork_reason=f'{why} (gateway.history = "template")')
    after = _after_reply(renderer, messages, at, tools, turn_ends)
    if after is None or not text.endswith(after[1]):
        why = f"{why}, and where its turn ends is not found"
        return PromptPlan(text, [], None, text, fork_reason=why)
    # after the reply's own end-of-turn token; a reply cut short gets the template's as context
    delta = after[1] if turn.text.endswith(turn_ends) else after[0] + after[1]
    return PromptPlan(turn.text + delta, turn.ids, turn.index, delta, True, template=text)


def _rewritten_turn(
    renderer: ChatRenderer,
    echoed: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    state: SessionState,
) -> tuple[RecordedTurn, int] | None:
    """The newest recorded turn whose reply the client echoes (`echoed`, as it sent them)
    after exactly the messages that rendered its prompt (`messages`, as rendered), and where."""
    keys = [canonical_assistant(m) if m["role"] == "assistant" else None for m in echoed]
    for turn in reversed(state.recorded):
        at = next((i for i in range(len(keys) - 1, -1, -1) if keys[i] == turn.key), None)
        if at is not None and renderer.render(messages[:at], tools) == turn.prompt:
            return turn, at
    return None


BRIDGE_SENTINEL = "TRACERL-BRIDGED-REPLY"
"""Stands in for a rewritten reply, to find where its turn ends in the template's rendering."""


def _after_reply(
    renderer: ChatRenderer,
    messages: list[dict[str, Any]],
    at: int,
    tools: list[dict[str, Any]],
    turn_ends: tuple[str, ...],
) -> tuple[str, str] | None:
    """The end-of-turn marker the template writes after the reply `messages[at]`, and its
    rendering of everything after that: the conversation is rendered with the reply replaced
    by a sentinel, whose turn ends at the first marker after it."""
    sentinel = {"role": "assistant", "content": BRIDGE_SENTINEL}
    rendered = renderer.render([*messages[:at], sentinel, *messages[at + 1 :]], tools)
    where = rendered.find(BRIDGE_SENTINEL)
    if where < 0 or not turn_ends:
        return None
    pattern = "|".join(re.escape(m) for m in sorted(turn_ends, key=len, reverse=True))
    end = re.compile(pattern).search(rendered, where)
    return (end.group(0), rendered[end.end() :]) if end is not None else None


def _as_sampled(messages: list[dict[str, Any]], raw: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Echoed replies as sampled: the n-th echo of a reply's text is the n-th sample recorded
    with that text (the last one past them), so alike replies keep their own samples."""
    seen: dict[str, int] = {}
    out = []
    for message in messages:
        if message["role"] == "assistant":
            key = canonical_assistant(message)
            samples = raw.get(key)
            if samples:
                n = seen[key] = seen.get(key, -1) + 1
                message = {"role": "assistant", "content": samples[min(n, len(samples) - 1)]}
        out.append(message)
    return out


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


def forced_call_of(parsed: ApiRequest, chat_format: ChatFormat) -> ForcedCall | None:
    """The forced call a `tool_choice` that requires one asks for, None otherwise."""
    if parsed.forced_tool is None:
        return None
    name = None if parsed.forced_tool == ANY_TOOL else parsed.forced_tool
    return chat_format.forced_call(name, parsed.tools)


def constrain(parsed: ApiRequest, forced: ForcedCall | None) -> str | None:
    """Set the JSON schema the engine must enforce on the reply (`spec.json_schema`) and return
    the caller's field it came from, for an engine's refusal of it; None when nothing is
    enforced. A forced call's schema comes first. A structured-output format is enforced
    unless the model may call tools on this turn: an engine's constraint covers the whole
    reply, so it would rule out the call the caller allowed."""
    if forced is not None:
        if forced.schema is None:  # the format's call body is not JSON: the prefix alone
            return None
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
    demonstration: dict[str, Any] | None = None
    """The reply the client demonstrated (`tracerl.gateway.demonstrations`), if any."""

    def outcome(self, completion: Completion, chat_format: ChatFormat) -> Outcome:
        """The reply as the API shows it: a forced call's prefix (context) and what the model
        sampled after it, parsed together (a call the budget cut is a call in progress). What
        the caller sees is only ever what was sampled: a forced reply that makes no call is
        its sampled text alone, never the prefix."""
        cut, tools = completion.finish == "length", self.parsed.tools
        sampled = completion.raw if chat_format.special_markup else completion.text
        parsed = chat_format.parse(self.forced + sampled, cut, tools)
        if self.forced and not parsed.tool_calls:
            parsed = chat_format.parse(sampled, cut, tools)
        ids = [self.dialect.new_tool_call_id() for _ in parsed.tool_calls]
        return Outcome(completion, parsed, ids)


async def commit_turn(
    store: TraceStore,
    turn: PendingTurn,
    outcome: Outcome,
    response: dict[str, Any],
    client_disconnected: bool,
) -> None:
    """Append `turn` to its session's trace (the sampled ids and log-probs as the engine returned
    them) and remember its text and ids, so the session's next turn can continue it."""
    state = turn.state
    assert state is not None
    c, prompt = outcome.completion, turn.prompt
    async with state.lock:
        # Every field comes from the gateway's own typed values: no re-validation of the
        # thousands of ids per turn (the store validates what it reads back).
        recorded = Turn.model_construct(
            index=state.next_index,
            endpoint=turn.dialect.endpoint,
            prompt_ids=prompt.ids,
            completion_ids=c.ids,
            completion_logprobs=c.logprobs,
            finish_reason=outcome.finish,
            weight_version=c.weight_version,
            weight_version_min=c.weight_version_min,
            adapter=c.adapter,
            routed_experts=None if c.routed_experts is None else RoutedExperts.of(c.routed_experts),
            client_disconnected=client_disconnected,
            request=turn.body,
            response=response,
            parent=prompt.parent,
            bridged=prompt.bridged,
            fork_reason=prompt.fork_reason,
            demonstration=turn.demonstration is not None,
            max_new_tokens=turn.parsed.spec.max_new_tokens,
        )
        await store.append_turn(state.session_id, recorded)
        state.next_index += 1
        start = len(prompt.text) - len(turn.forced)  # a forced prefix belongs to the reply
        state.remember(
            RecordedTurn(
                recorded.index,
                prompt.text + c.full_text,
                prompt.ids + c.ids,
                start,
                prompt.template,
            ),
            outcome.returned_message(),
            turn.forced + c.raw,  # the assistant message as re-rendered: prefix included
        )
