"""The gateway: OpenAI and Anthropic surfaces that render, generate token-in/token-out, and record.

A pure model boundary: one request is one turn. It renders messages to tokens, asks the engine
pool for tokens, parses them back into the caller's API shape, and returns success only after the
turn is durably recorded. It neither trains nor chooses engines.
"""
