"""tracerl: reinforcement learning for LLM agents from exactly recorded traces."""

__version__ = "0.1.0"
