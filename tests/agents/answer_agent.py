"""A test agent that knows nothing of tracerl: the task as JSON on stdin, the model through the
official SDKs configured only by the standard environment variables, the reward on stdout.

Task fields: `prompt`, `answer`; `api` ("openai" or "anthropic", default openai); `print_reward`
(default true; false prints a plain line, leaving the reward to the trainer's reward function).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    task = json.loads(sys.stdin.readline())
    sampling = json.loads(os.environ.get("TRACERL_SAMPLING", "{}"))
    if task.get("api", "openai") == "anthropic":
        import anthropic

        claude = anthropic.Anthropic(max_retries=0, timeout=60)  # ANTHROPIC_BASE_URL / _API_KEY
        message = claude.messages.create(
            model="agent-model",
            max_tokens=sampling.get("max_tokens", 64),
            messages=[{"role": "user", "content": task["prompt"]}],
        )
        text = "".join(block.text for block in message.content if block.type == "text")
    else:
        import openai

        client = openai.OpenAI(max_retries=0, timeout=60)  # OPENAI_BASE_URL / OPENAI_API_KEY
        reply = client.chat.completions.create(
            model="agent-model",
            messages=[{"role": "user", "content": task["prompt"]}],
            **sampling,
        )
        text = reply.choices[0].message.content or ""
    if not task.get("print_reward", True):
        print(f"agent said: {text}")
        return
    metrics = {
        "reply_chars": len(text),
        "anthropic_env": bool(os.environ.get("ANTHROPIC_BASE_URL"))
        and os.environ.get("ANTHROPIC_API_KEY") == os.environ.get("OPENAI_API_KEY"),
        "extra_env": os.environ.get("AGENT_EXTRA") == "set-by-config",
    }
    print("some log line the runner must ignore")
    print(json.dumps({"reward": 1.0 if str(task["answer"]) in text else 0.0, "metrics": metrics}))


if __name__ == "__main__":
    main()
