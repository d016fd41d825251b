"""Configuration of environments (which task an episode runs) and task datasets (where tasks
come from).

`EnvConfig` is a discriminated union on `name`: "arithmetic", "concise", "calculator",
"guess", "files", "reasoning-gym", "textarena", "verifiers", "openenv", "command",
"claude-code", "codex".
`DatasetConfig` reads tasks from a local file or directory, or generates them with a built-in task.
Like every config module this one never imports torch, nor the environments themselves.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from tracerl.config.base import Config, ConfigError, format_validation_error


class SamplingConfig(Config):
    """What an environment asks the gateway for on every turn (the session may override it)."""

    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature sent with every request."""
    max_tokens: int = Field(default=256, ge=1)
    """Completion budget of one turn."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling; unset leaves the engine's default."""


class ChatEnvConfig(Config):
    """Fields shared by the built-in environments, which talk to the gateway with the openai SDK."""

    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    request_timeout_s: float = Field(default=300.0, gt=0)
    """Timeout of one request through the SDK (which never retries: the pool does)."""
    system_prompt: str | None = None
    """A system message put before the task's prompt; unset sends none."""


class ArithmeticEnvConfig(ChatEnvConfig):
    name: Literal["arithmetic"] = "arithmetic"


class ConciseEnvConfig(ChatEnvConfig):
    name: Literal["concise"] = "concise"


class CalculatorEnvConfig(ChatEnvConfig):
    name: Literal["calculator"] = "calculator"
    max_turns: int = Field(default=4, ge=1, le=64)
    """Model turns per episode; an episode still calling tools after this many scores 0."""
    tool_use_reward: float = Field(default=0.0, ge=0, le=1)
    """Reward of a wrong final answer after at least one valid tool call (0: exact answer
    only). A small model that never gets the answer gives GRPO only uniform groups; a little
    credit for using the tool gives it a signal to start from."""
    single_operation: bool = False
    """The tool takes one operation on two numbers per call (`347 * 29`) and answers anything
    longer with an error: a question of two operations takes two calls, the second on the
    first's result, and a final answer (three model turns). The harder, truly multi-turn form
    of the task; the default tool evaluates any expression in one call."""


class GuessEnvConfig(ChatEnvConfig):
    name: Literal["guess"] = "guess"
    max_turns: int = Field(default=8, ge=1, le=64)
    """Model turns per episode; the number not found in this many scores 0 (a binary search
    needs at most 6 guesses for the largest range, 32)."""


class FilesEnvConfig(ChatEnvConfig):
    name: Literal["files"] = "files"
    max_turns: int = Field(default=8, ge=1, le=64)
    """Model turns per episode; an episode still calling tools after this many scores 0 (the
    scripted search takes 4 to 6 with the generated three folders)."""


class ReasoningGymEnvConfig(ChatEnvConfig):
    """A reasoning-gym task generator as the dataset, its verifier as the reward
    (`tracerl.envs.adapters.reasoning_gym`; the `reasoning-gym` extra)."""

    name: Literal["reasoning-gym"] = "reasoning-gym"
    dataset: str
    """A reasoning-gym dataset name (`leg_counting`, `basic_arithmetic`, `countdown`, ...)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Its generator's settings (`min_animals = 2`, ...), as reasoning-gym names them."""
    prompt_style: str = "default"
    """Which of reasoning-gym's system prompts to send (`default`, `simple`, `direct`, ...);
    `system_prompt` replaces it with text of your own, and `""` sends none."""
    answer_tag: str | None = "answer"
    """The reply's answer is inside `<answer_tag>...</answer_tag>` (reasoning-gym's own
    extraction: no tag, no answer, reward 0); unset scores the whole reply."""
    eval_tasks: int = Field(default=200, ge=1)
    """How many tasks the `eval` split generates when `eval_dataset.num_tasks` is unset (the
    `train` split: 1000)."""


class TextArenaEnvConfig(ChatEnvConfig):
    """A single-player TextArena game as a multi-turn episode
    (`tracerl.envs.adapters.textarena`; the `textarena` extra)."""

    name: Literal["textarena"] = "textarena"
    game: str
    """A registered single-player game id (`GuessTheNumber-v0`, `Wordle-v0`, ...)."""
    max_turns: int = Field(default=32, ge=1, le=1024)
    """Model turns per episode; a game not over by then ends there and scores 0 (TextArena
    has no reward for an unfinished game)."""


class VerifiersEnvConfig(Config):
    """An installed verifiers environment, its rollout logic and rubric
    (`tracerl.envs.adapters.verifiers`; the `verifiers` extra)."""

    name: Literal["verifiers"] = "verifiers"
    id: str
    """The environment's id: the installed module verifiers loads (`vf-math` -> `vf_math`)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of its `load_environment`."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sent as the rollout's sampling arguments (the session may override them)."""
    request_timeout_s: float = Field(default=300.0, gt=0)
    """Timeout of one model call through the SDK (which never retries: the pool does)."""


class OpenEnvEnvConfig(ChatEnvConfig):
    """An OpenEnv environment server, stepped with the model's replies
    (`tracerl.envs.adapters.openenv`; the `openenv` extra). Exactly one of `url` and `app`."""

    name: Literal["openenv"] = "openenv"
    url: str | None = None
    """A running server (`http://127.0.0.1:8000`)."""
    app: str | None = None
    """`module:app`, an OpenEnv server app the run starts itself (uvicorn on 127.0.0.1, a free
    port) before the first episode and stops at its end."""
    python: str | None = None
    """The interpreter that serves `app` (its environment's venv); unset: this one."""
    cwd: str | None = None
    """The server's working directory (where `module` is found); unset: the current one."""
    server_env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server."""
    start_timeout_s: float = Field(default=120.0, gt=0)
    """How long the started server may take to answer `/health`."""
    max_sessions: int | None = Field(default=None, ge=1)
    """Episodes connected at once, at most: the server's `max_concurrent_envs` (OpenEnv
    refuses a session past it rather than queueing it); unset: no limit here."""
    action_field: str = "message"
    """The action's field the model's reply goes into (its text)."""
    observation_field: str | None = None
    """The observation's field sent to the model as the next user message; unset: its only
    text field, or the whole observation as JSON when it has none or several."""
    reset_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of every reset (a task's `seed` and its own `reset_args` join them)."""
    max_turns: int = Field(default=16, ge=1, le=1024)
    """Model turns per episode; an episode not done by then ends there."""
    reward: Literal["sum", "last"] = "sum"
    """The episode's reward: the sum of every reward the environment gave (its return), or
    the last one. No reward at all is 0."""
    message_timeout_s: float = Field(default=300.0, gt=0)
    """How long one reset or step may take on the server."""

    @model_validator(mode="after")
    def _one_server(self) -> Self:
        if (self.url is None) == (self.app is None):
            raise ValueError("set exactly one of url (a running server) and app (one to start)")
        return self


class CommandEnvConfig(Config):
    name: Literal["command"] = "command"
    argv: list[str] = Field(min_length=1)
    """The agent program and its arguments (no shell). It reads the task as JSON on stdin."""
    cwd: str | None = None
    """Working directory of the agent; unset is the current one."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the agent (the session's URLs and key are always set)."""
    inherit_env: bool = True
    """Start from this process's environment (PATH, HOME, ...); false starts from an empty one."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Wall-clock limit of one agent run; past it the agent's whole process group is killed."""
    reward_fn: str | None = None
    """Reward over the final trace when the agent prints no reward: a built-in name
    ("arithmetic", "concise", "calculator") or "module:function" taking (task, trace)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Passed to the agent as JSON in $TRACERL_SAMPLING (an agent may ignore it)."""


class CliAgentEnvConfig(Config):
    """A coding-agent CLI run non-interactively per episode (`tracerl.envs.cli_agents`)."""

    executable: str
    """The CLI to run: a name on PATH or a path."""
    model: str = "tracerl"
    """The model name the CLI sends (the gateway serves its one model whatever the name)."""
    args: list[str] = Field(default_factory=list)
    """Extra arguments, after the ones the environment sets."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the CLI."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Wall-clock limit of one run; past it the CLI's whole process group is killed."""
    check: str | None = None
    """A shell command run in the episode's working directory after the CLI exits: exit 0 is
    reward 1, anything else 0 (a task's own `check` field takes precedence), e.g.
    `test -f hello.txt` or `python -m pytest -q`."""
    check_timeout_s: float = Field(default=120.0, gt=0)
    reward_fn: str | None = None
    """Reward over the final trace when there is no check: a built-in name or
    "module:function" taking (task, trace)."""
    keep_workdir: bool = False
    """Keep each episode's working directory (printed in the failure reason) for debugging."""
    agent_errors: Literal["score", "fail"] = "score"
    """A CLI that exits non-zero: "score" scores its run like any other (its check or
    reward_fn), since a CLI stops on the model's own replies (one cut by its token budget, a
    call it cannot run), and those are the episodes to learn not to repeat; the error is kept
    (metric `agent_error`) and an episode that recorded no reply fails with it (a prompt past
    the context). "fail" fails every such episode (never trained)."""


class ClaudeCodeEnvConfig(CliAgentEnvConfig):
    name: Literal["claude-code"] = "claude-code"
    executable: str = "claude"
    max_turns: int = Field(default=10, ge=1)
    """`--max-turns`: agent turns per episode."""
    allowed_tools: list[str] = Field(default_factory=lambda: ["Bash", "Read", "Edit", "Write"])
    """`--allowedTools`: the tools the agent may use without asking."""


class CodexEnvConfig(CliAgentEnvConfig):
    name: Literal["codex"] = "codex"
    executable: str = "codex"
    sandbox: Literal["read-only", "workspace-write", "danger-full-access"] = "danger-full-access"
    """`--sandbox`. Codex's other modes run each command under bubblewrap, which needs user
    namespaces many containers lack; the episode's working directory is its own anyway."""


EnvConfig = Annotated[
    ArithmeticEnvConfig
    | ConciseEnvConfig
    | CalculatorEnvConfig
    | GuessEnvConfig
    | FilesEnvConfig
    | ReasoningGymEnvConfig
    | TextArenaEnvConfig
    | VerifiersEnvConfig
    | OpenEnvEnvConfig
    | CommandEnvConfig
    | ClaudeCodeEnvConfig
    | CodexEnvConfig,
    Field(discriminator="name"),
]
"""One environment's configuration, chosen by its `name`."""

_ENV_ADAPTER: TypeAdapter[EnvConfig] = TypeAdapter(EnvConfig)


def parse_env_config(data: object, source: str = "env") -> EnvConfig:
    """Validate a plain dict into an `EnvConfig`; `ConfigError` names every dotted path."""
    try:
        return _ENV_ADAPTER.validate_python(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, EnvConfig)) from None


class DatasetConfig(Config):
    """Where an environment's tasks come from: exactly one of `path` and `generate`."""

    path: str | None = None
    """A JSONL file, a Parquet file, or a directory written by `datasets.save_to_disk`."""
    format: Literal["auto", "jsonl", "parquet", "datasets"] = "auto"
    """How to read `path`; "auto" goes by the suffix (.jsonl, .parquet) or a directory."""
    split: str | None = None
    """The split to use when `path` holds a `datasets.DatasetDict`; with `generate = "env"`,
    the environment's split ("train" for `[dataset]` and "eval" for `[eval_dataset]` when
    unset)."""
    generate: (
        Literal[
            "arithmetic",
            "concise",
            "calculator",
            "calculator-long",
            "calculator-mixed",
            "guess",
            "files",
            "env",
        ]
        | None
    ) = None
    """Generate tasks with this built-in task instead of reading a file; "env" takes them from
    the environment itself (reasoning-gym's generators, a verifiers environment's dataset)."""
    num_tasks: int | None = Field(default=None, ge=1)
    """How many tasks `generate` makes (a built-in task: 1000 when unset; "env": the
    environment's own count, all of a verifiers dataset's rows)."""
    seed: int = Field(default=0, ge=0)
    """Seed of generation and of the per-epoch shuffle."""
    shuffle: bool = True
    """Visit tasks in a new seeded order every epoch; false keeps the file order."""
    difficulty: Literal["uniform", "signal"] = "uniform"
    """How tasks are drawn: `uniform`, each in its turn; `signal`, a task whose last group's
    rewards were all equal (always solved, or never) is passed over with probability
    `difficulty_skip` when its turn comes again (`tracerl.envs.dataset`): fewer samples where a
    group baseline has no signal. It acts from the second epoch on (a task is measured by its
    own groups), and not with groups of one."""
    difficulty_skip: float = Field(default=0.75, ge=0, le=1)
    """The chance that a task without signal is passed over when its turn comes."""
    difficulty_by: str | None = None
    """A task field (a string or number in every row) over whose values `signal` measures
    instead of over rows: tasks sharing a value share its last group's verdict (the guessing
    game's `high`, a generator's level). It then acts in the first epoch, where a generated
    dataset's rows never come back."""
    max_row_bytes: int = Field(default=16 * 2**20, ge=2)
    """JSONL: a longer line is refused (named by file and line) rather than read into memory."""

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.path is None) == (self.generate is None):
            raise ValueError("set exactly one of path and generate")
        if self.difficulty_by is not None and self.difficulty != "signal":
            raise ValueError("difficulty_by applies to difficulty = 'signal' only")
        return self
