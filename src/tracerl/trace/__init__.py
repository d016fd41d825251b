"""The trace: what the gateway records and what the loop, the environments and the trainer read.

Owns the trace schema (sessions, turns, trajectories) and the pure assembly of turns into
trajectories. It is the contract between the gateway, which writes traces, and everything that
reads them, so those readers never import the gateway. Must not do I/O: the SQLite store that
persists traces belongs to the gateway.
"""
