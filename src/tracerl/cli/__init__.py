"""Thin command-line entry points. Configuration is parsed and validated before torch is imported,
so `--help` and configuration errors come back in well under a second.

Owns argument parsing and the wiring of one command. Must not contain logic: each command hands
its checked config to the package that does the work."""
