"""Inference engines: the `Engine` protocol, the embedded engine and the engine wire protocol.

Knows tokens, not sessions or RL. Heavy modules (torch) are imported by the submodules that need
them, so `tracerl.engine.types` stays cheap to import.
"""
