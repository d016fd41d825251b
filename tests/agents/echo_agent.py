"""A test agent that prints `task["stdout"]` verbatim (no model call): drives the runner's parsing
of reward lines."""

from __future__ import annotations

import json
import sys

task = json.loads(sys.stdin.readline())
sys.stdout.write(task["stdout"])
