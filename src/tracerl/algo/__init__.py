"""Pure tensor math for RL. Owns advantages (group baselines, GAE), losses (policy, value, KL) and
statistics. Must not hold state or do I/O.

Tensors are packed: `[T]` over a batch of trajectories whose boundaries are `cu_seqlens`
(`[0, ..., T]`, int64). `loss_mask` is 1 on sampled (action) tokens and 0 on prompt and
observation tokens.
"""
