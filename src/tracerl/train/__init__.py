"""Training: the actor and the critic derived from it, batching by token budget, PPO and
group-baseline steps, the LR schedule, memory phases, checkpoints and Hugging Face export.
Must not talk HTTP.

What the RL loop uses (see `tracerl.train.trainer` for the walk-through):

- `TrainSample(token_ids, loss_mask, logprobs, reward, group_id, weight_version)`, or
  `TrainSample.from_trajectory(trajectory, reward=..., group_id=..., weight_version=...)`;
- `Trainer(config: TrainerConfig, device=None)`: `step(samples) -> dict[str, float]`,
  `save_checkpoint(dir, loop_state) -> Path`, `load_checkpoint(path) -> loop_state`,
  `export(path) -> Path`, `actor_named_tensors()`, `step_count`;
- `latest_checkpoint(dir) -> Path | None`.
"""

from tracerl.train.batch import SampleError, TrainSample
from tracerl.train.checkpoint import CheckpointError, latest_checkpoint
from tracerl.train.phases import PhaseError
from tracerl.train.trainer import Trainer

__all__ = [
    "CheckpointError",
    "PhaseError",
    "SampleError",
    "TrainSample",
    "Trainer",
    "latest_checkpoint",
]
