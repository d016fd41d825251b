"""Thin command-line entry points. Configuration is parsed and validated before torch is imported,
so `--help` and configuration errors come back in well under a second."""
