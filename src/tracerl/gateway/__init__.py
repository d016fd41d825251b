"""The gateway: OpenAI and Anthropic surfaces that render, generate token-in/token-out, and record.

A pure model boundary: one request is one turn. It renders messages to tokens, asks the engine
pool for tokens, parses them back into the caller's API shape, and returns success only after the
turn is durably recorded. Owns the two API surfaces (one `Dialect` each), chat-template
rendering and incremental tokenization, tool-call and reasoning parsing, the SQLite trace store,
the fail-closed policy and session auth. Must not train, or choose engines (it asks the pool).
"""
