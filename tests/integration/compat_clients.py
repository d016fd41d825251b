"""Third-party agent frameworks, each making one model call through a gateway session as its
users would: `python compat_clients.py NAME`, with the session's OpenAI base URL and key in
`TRACERL_BASE_URL` and `TRACERL_API_KEY`. Run in the compatibility venv (`make test-compat`),
never imported by the suite. Prints the framework's final text as the last stdout line."""

from __future__ import annotations

import os
import sys

BASE, KEY = os.environ["TRACERL_BASE_URL"], os.environ["TRACERL_API_KEY"]
PROMPT = "Say hello."


def openai_agents() -> str:
    """openai-agents' default model: the Responses API."""
    from openai import AsyncOpenAI

    from agents import Agent, Runner, set_default_openai_client, set_tracing_disabled

    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=BASE, api_key=KEY, max_retries=0), False)
    agent = Agent(name="assistant", instructions="Be brief.", model="tiny")
    return str(Runner.run_sync(agent, PROMPT).final_output)


def pydantic_ai() -> str:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIResponsesModel("tiny", provider=OpenAIProvider(base_url=BASE, api_key=KEY))
    return str(Agent(model, instructions="Be brief.").run_sync(PROMPT).output)


def langchain_openai() -> str:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model="tiny", base_url=BASE, api_key=KEY, max_retries=0)  # type: ignore[arg-type]
    return str(chat.invoke(PROMPT).content)


def litellm() -> str:
    import litellm as lite

    reply = lite.completion(
        model="openai/tiny", api_base=BASE, api_key=KEY, num_retries=0,
        messages=[{"role": "user", "content": PROMPT}],
    )  # fmt: skip
    return str(reply.choices[0].message.content)


def smolagents() -> str:
    """smolagents' default ToolCallingAgent, which forces a tool call on every step."""
    from smolagents import OpenAIServerModel, ToolCallingAgent

    model = OpenAIServerModel(model_id="tiny", api_base=BASE, api_key=KEY)
    agent = ToolCallingAgent(tools=[], model=model, max_steps=2, verbosity_level=0)
    return str(agent.run(PROMPT))


CLIENTS = {
    f.__name__: f for f in (openai_agents, pydantic_ai, langchain_openai, litellm, smolagents)
}

if __name__ == "__main__":
    print(CLIENTS[sys.argv[1]]())
