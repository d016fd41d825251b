"""Environments: the `Environment` protocol, reward functions, built-in tasks, the external-agent
runner, and task datasets.

An environment plays one episode of a task by talking to the model through a gateway session
(OpenAI/Anthropic base URLs and a key) and returns a reward. Must not touch tokens: the gateway
records them. The loop calls `run_episode(env, task, session, timeout_s)`, which turns timeouts
and crashes into failed records, and `score_trace` when the reward comes from the trace.
"""

from tracerl.envs.base import Environment, EnvResult, Session, Task, TraceReward
from tracerl.envs.dataset import DatasetError, IndexedTask, TaskDataset, load_dataset
from tracerl.envs.episode import EpisodeResult, run_episode, score_trace
from tracerl.envs.registry import ENVIRONMENTS, generate_tasks, make_environment
from tracerl.envs.rewards import final_text, load_reward_fn

__all__ = [
    "ENVIRONMENTS",
    "DatasetError",
    "EnvResult",
    "Environment",
    "EpisodeResult",
    "IndexedTask",
    "Session",
    "Task",
    "TaskDataset",
    "TraceReward",
    "final_text",
    "generate_tasks",
    "load_dataset",
    "load_reward_fn",
    "make_environment",
    "run_episode",
    "score_trace",
]
