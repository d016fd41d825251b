"""Adaptive rollout concurrency: a pure controller, the dispatcher that applies its cap, and the
collector that feeds it engine metrics."""
