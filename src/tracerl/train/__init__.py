"""Training: models, batching, optimizer and LR schedule, PPO and group-baseline steps,
checkpoints. Never talks HTTP."""
