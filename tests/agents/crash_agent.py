"""A test agent that crashes: reads its task, complains on stderr, exits with status 3."""

from __future__ import annotations

import sys

sys.stdin.readline()
print("partial output", flush=True)
print("agent: cannot parse the task, giving up", file=sys.stderr)
sys.exit(3)
