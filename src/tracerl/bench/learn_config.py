"""The `tracerl train` configs `tracerl bench learn` generates: one layout for the single-turn
tasks (`learn`) and the agentic ones (`learn_agents`), which differ only in the values given."""

from __future__ import annotations

from pathlib import Path


def train_config(
    *,
    model: str,
    algorithm: str,
    seed: int,
    lr: float,
    token_budget: int,
    env: str,
    max_tokens: int,
    train: Path,
    heldout: Path,
    batch_size: int,
    group_size: int,
    steps: int,
    minutes: float | None,
    eval_every: int,
    engine: str,
    chat_template: str | None = None,
    episode_timeout_s: float | None = None,
    snapshot_every: int | None = None,
    eval_by: str | None = None,
    extra: str = "",
) -> str:
    """A run's config: `env` and `engine` are the lines of those sections, `extra` more
    sections; `minutes` None sets no budget (`steps` alone ends the run); `chat_template` and
    `episode_timeout_s` unset keep the defaults; a checkpoint at the end (to resume or export
    from) and, with `snapshot_every`, the actor's weights every that many steps and at the end
    (`loop.snapshot_every`: what the judge scores, without the optimizer state); `eval_by` a
    task field each eval also reports its accuracy per value of (`eval.by`)."""
    budget = f"max_minutes = {minutes}" if minutes is not None else ""
    template = f'chat_template = "{chat_template}"' if chat_template else ""
    timeout = f"episode_timeout_s = {episode_timeout_s}" if episode_timeout_s else ""
    snapshots = f"snapshot_every = {snapshot_every}" if snapshot_every else ""
    by = f'by = "{eval_by}"' if eval_by else ""
    return f"""
[trainer]
model = "{model}"
{template}
algorithm = "{algorithm}"
temperature = 1.0
seed = {seed}
token_budget = {token_budget}
keep_last_n = 2

[trainer.actor]
lr = {lr}
schedule = "constant"

[env]
{env}

[env.sampling]
temperature = 1.0
max_tokens = {max_tokens}

[dataset]
path = "{train}"
seed = {seed}

[eval_dataset]
path = "{heldout}"
shuffle = false

[orchestrator]
batch_size = {batch_size}
group_size = {group_size}

[loop]
steps = {steps}
{budget}
seed = {seed}
{timeout}
checkpoint_every = 100000
{snapshots}

[eval]
every = {eval_every}
{by}

[engine]
{engine}

[logging]
progress = false
{extra}
"""
