"""Third-party agent frameworks, each making one model call through a gateway session as its
users would: `python compat_clients.py NAME`, with the session's OpenAI base URL and key in
`TRACERL_BASE_URL` and `TRACERL_API_KEY`. Run in the compatibility venv (`make test-compat`),
never imported by the suite. Prints the framework's final text as the last stdout line.

The instructor clients (`instructor_tools`, `instructor_json`, `instructor_json_schema`) run in
instructor's own venv (`.venv-compat/instructor`) and print the extracted object as JSON."""

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


def extract_person(mode: str) -> str:
    """instructor's extraction of a small pydantic model in one of its modes (`instructor.Mode`
    member name), with no retry: a retry would replay the scripted engine's replies."""
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    client = instructor.from_openai(
        OpenAI(base_url=BASE, api_key=KEY, max_retries=0), mode=instructor.Mode[mode]
    )
    person = client.chat.completions.create(
        model="tiny", response_model=Person, max_retries=0,
        messages=[{"role": "user", "content": "Ada Lovelace died at 36. Who is this?"}],
    )  # fmt: skip
    return person.model_dump_json()


def instructor_tools() -> str:
    """Mode.TOOLS: the model is made to call a tool whose parameters are the model's schema."""
    return extract_person("TOOLS")


def instructor_json() -> str:
    """Mode.JSON: `response_format: {"type": "json_object"}`, the schema in the system message."""
    return extract_person("JSON")


def instructor_json_schema() -> str:
    """Mode.JSON_SCHEMA: a json_schema response format carrying the model's schema."""
    return extract_person("JSON_SCHEMA")


CLIENTS = {
    f.__name__: f
    for f in (
        openai_agents, pydantic_ai, langchain_openai, litellm, smolagents, instructor_tools,
        instructor_json, instructor_json_schema,
    )
}  # fmt: skip

if __name__ == "__main__":
    print(CLIENTS[sys.argv[1]]())
