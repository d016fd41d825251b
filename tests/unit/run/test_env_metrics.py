"""What environments report per episode reaches the step's metrics as `env/NAME` means."""

from __future__ import annotations

from tracerl.envs import EpisodeResult
from tracerl.run.rollouts import Rollout, env_metrics


def rollout(**metrics: float) -> Rollout:
    return Rollout(0, "train", EpisodeResult(1.0, dict(metrics)))


def test_each_metric_is_averaged_over_the_episodes_that_reported_it() -> None:
    rollouts = [rollout(agent_error=1.0, turns=3.0), rollout(agent_error=0.0), rollout()]
    assert env_metrics(rollouts) == {"env/agent_error": 0.5, "env/turns": 3.0}
    assert env_metrics([rollout(), rollout()]) == {}


def test_the_share_of_episodes_that_stayed_one_trajectory() -> None:
    from tracerl.train.batch import TrainSample

    def ended(trajectories: int) -> Rollout:
        sample = TrainSample([1, 2], [0, 1], [0.0, -0.5], 1.0)
        return Rollout(0, "train", EpisodeResult(1.0, {}), samples=[sample] * trajectories)

    rollouts = [ended(1), ended(1), ended(2), ended(1), rollout()]  # the last one has no samples
    assert env_metrics(rollouts) == {"rollout/one_trajectory_frac": 0.75}
