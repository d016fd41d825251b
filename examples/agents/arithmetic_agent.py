"""An external agent tracerl can train without changes: it only speaks the OpenAI API.

Contract with the `command` environment (see `tracerl.envs.command`):
- the task arrives as one JSON line on stdin (here `{"prompt": ..., "answer": ...}`);
- the OpenAI SDK reads `OPENAI_BASE_URL` and `OPENAI_API_KEY`, which point it at a gateway
  session, so every request is recorded token by token (`ANTHROPIC_BASE_URL` and
  `ANTHROPIC_API_KEY` are set as well for agents on the Anthropic SDK);
- `TRACERL_SAMPLING` holds the sampling fields the trainer wants (passing them on is optional);
- the last stdout line `{"reward": r, "metrics": {...}}` is the episode's reward. An agent that
  cannot judge itself prints none and sets `reward_fn` in the environment config instead.

Try it by hand against `tracerl serve`:
    curl -s -X POST localhost:8000/sessions -H "Authorization: Bearer $ADMIN_KEY"
    OPENAI_BASE_URL=<openai_base_url> OPENAI_API_KEY=<api_key> \
        python examples/agents/arithmetic_agent.py <<< '{"prompt": "What is 2 + 3?", "answer": 5}'
"""

from __future__ import annotations

import json
import os
import re
import sys

import openai

SYSTEM = "You are a careful calculator. Answer with the number only."


def main() -> None:
    task = json.loads(sys.stdin.readline())
    sampling = json.loads(os.environ.get("TRACERL_SAMPLING", "{}"))
    # No SDK retries: a retried request would be recorded as a second turn.
    client = openai.OpenAI(max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=os.environ.get("TRACERL_MODEL", "policy"),
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task["prompt"]},
        ],
        **sampling,
    )
    text = reply.choices[0].message.content or ""
    numbers = re.findall(r"-?\d+", text)
    correct = bool(numbers) and int(numbers[-1]) == int(task["answer"])
    print(json.dumps({"reward": float(correct), "metrics": {"reply_chars": len(text)}}))


if __name__ == "__main__":
    main()
