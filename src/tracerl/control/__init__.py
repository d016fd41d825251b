"""Adaptive rollout concurrency. Owns the controller (a pure state machine, no I/O), the
dispatcher that applies its cap and sheds, and the collector that feeds it engine metrics. Must
not own network clients inside the controller (the collector polls; the controller decides)."""
