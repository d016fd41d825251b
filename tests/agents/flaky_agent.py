"""A test agent for the loop: asks the model through the openai SDK (configured only by the
standard environment variables), then crashes on a fixed quarter of the tasks (exit 3) and
otherwise prints a reward that prefers short replies."""

from __future__ import annotations

import json
import os
import sys

import openai

task = json.loads(sys.stdin.readline())
sampling = json.loads(os.environ.get("TRACERL_SAMPLING", "{}"))
client = openai.OpenAI(max_retries=0, timeout=60)
reply = client.chat.completions.create(
    model="agent-model",
    messages=[{"role": "user", "content": task["prompt"]}],
    **sampling,
)
text = reply.choices[0].message.content or ""
if sum(map(ord, task["prompt"])) % 4 == 0:
    print("agent: giving up on this one", file=sys.stderr)
    sys.exit(3)
words = len(text.split())
print(json.dumps({"reward": 1.0 / (1 + words), "metrics": {"words": words}}))
