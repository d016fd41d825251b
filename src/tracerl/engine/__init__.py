"""Inference engines. Owns the `Engine` protocol, the embedded engine, the simulated engine and the
engine wire protocol (HTTP server and client).

Must not know about sessions or RL: it knows tokens. Heavy modules (torch) are imported by the
submodules that need them, so `tracerl.engine.types` stays cheap to import.
"""
