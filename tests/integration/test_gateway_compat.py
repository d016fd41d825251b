"""What real agents need beyond the core APIs: Claude Code's request shape (system messages
inside `messages`, its extra fields, headers and `?beta=true`), token budgets capped to the
room the context leaves, base-URL probes, `/v1/models` behind the session key, an access log
line per request and `x-should-retry: false` where a retry cannot help."""

from __future__ import annotations

import aiohttp
import anthropic
import openai
import pytest

from tests.integration.test_gateway_sdk import claude, oai


async def test_claude_codes_request_shape_is_accepted_and_rendered_where_it_stands(
    fake_engine, make_gateway
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client)
    session = await gw.open_session()
    client = claude(session)
    fake.say("Done.")
    reply = await client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=64,
        system=[
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /w"}]},  # type: ignore[list-item]
        ],
        extra_body={
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"},
            "metadata": {"user_id": '{"device_id": "d", "session_id": "s"}'},
        },
        extra_headers={"anthropic-beta": "claude-code-20250219,context-management-2025-06-27"},
        extra_query={"beta": "true"},
    )  # fmt: skip
    assert reply.content[0].text == "Done."  # type: ignore[union-attr]
    (turn,) = (await gw.trace(session["session_id"]))["turns"]
    prompt = fake.tokenizer.decode(turn["prompt_ids"])
    first, env = prompt.index("list the files"), prompt.index("# Environment")
    assert prompt.index("You are an agent.") < first < env  # the system turn where it stood
    assert "<|im_start|>system\n# Environment\ncwd: /w<|im_end|>" in prompt
    await client.close()


@pytest.mark.parametrize(
    ("api", "field"),
    [("chat", "max_tokens"), ("chat", "max_completion_tokens"), ("messages", "max_tokens"),
     ("responses", "max_output_tokens")],
)  # fmt: skip
async def test_a_budget_beyond_the_context_is_capped_or_rejected_naming_the_field(
    fake_engine, make_gateway, api: str, field: str
) -> None:
    fake, engine_client = fake_engine
    gw = await make_gateway(engine_client, max_model_len=256)
    strict = await make_gateway(engine_client, max_model_len=256, max_tokens_policy="reject")

    async def ask(handle, budget: int, text: str = "hi") -> None:
        session = await handle.open_session()
        if api == "messages":
            async with claude(session) as c:
                await c.messages.create(
                    model="m", max_tokens=budget, messages=[{"role": "user", "content": text}]
                )
            return
        async with oai(session) as o:
            if api == "chat":
                messages = [{"role": "user", "content": text}]
                await o.chat.completions.create(model="m", messages=messages, **{field: budget})
            else:
                await o.responses.create(model="m", input=text, max_output_tokens=budget)

    await ask(gw, 16000)  # far past the context (Claude Code asks for 32000): capped
    (sent,) = fake.requests
    room = 256 - len(sent["input_ids"])
    assert sent["sampling_params"]["max_new_tokens"] == room
    trace = await gw.store.trace(next(iter(gw.gateway.sessions)))
    assert trace is not None and trace.turns[0].max_new_tokens == room
    errors = (openai.BadRequestError, anthropic.BadRequestError)
    with pytest.raises(errors) as caught:
        await ask(strict, 16000)
    body = caught.value.body
    error = body.get("error", body) if isinstance(body, dict) else {}
    message = str(error.get("message", ""))
    assert field in message and "sampling_params" not in message, message
    assert "leaves" in message and "256-token context" in message
    with pytest.raises(errors) as caught:  # a prompt that leaves no room: either policy
        await ask(gw, 10, "word " * 300)
    assert "context is 256 tokens" in str(caught.value)
    assert len(fake.requests) == 1  # nothing rejected reached the engine


async def test_probes_models_and_the_access_log(fake_engine, make_gateway, capsys) -> None:
    _, engine_client = fake_engine
    gw = await make_gateway(engine_client, access_log=True)
    session = await gw.open_session()
    sid, key = session["session_id"], session["api_key"]
    auth = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/v1", f"/s/{sid}", f"/s/{sid}/v1", f"/s/{sid}/api/hello"):
            for method in ("GET", "HEAD"):
                async with http.request(method, gw.url + path) as resp:
                    assert resp.status == 200, (method, path)
        for headers, path, status in (
            ({}, f"/s/{sid}/v1/models", 401),
            ({"Authorization": "Bearer wrong"}, f"/s/{sid}/v1/models", 401),
            (auth, f"/s/{'0' * 32}/v1/models", 404),
            (auth, f"/s/{sid}/v1/models", 200),
            ({}, "/v1/models", 401),
            (gw.admin, "/v1/models", 200),
        ):
            async with http.get(gw.url + path, headers=headers) as resp:
                assert resp.status == status, (path, headers)
                should = resp.headers.get("x-should-retry")
                assert should == ("false" if status >= 400 else None)
    async with oai(session) as client:
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        with pytest.raises(openai.NotFoundError) as caught:
            await client.post("/nowhere", cast_to=object)
        assert caught.value.response.headers["x-should-retry"] == "false"
    lines = capsys.readouterr().out.splitlines()
    usage = reply.usage
    assert usage is not None
    generation = [line for line in lines if "/v1/chat/completions" in line]
    assert len(generation) == 1
    method, path, who, status, tokens, ms, unit = generation[0].split()
    assert (method, path, who, status) == ("POST", f"/s/{sid}/v1/chat/completions",
                                           f"session={sid[:16]}", "200")  # fmt: skip
    assert tokens == f"tokens={usage.prompt_tokens}+{usage.completion_tokens}"
    assert float(ms) >= 0 and unit == "ms"
    assert any(line.startswith(f"GET /s/{sid}/v1/models session=") and " 401 " in line
               for line in lines)  # fmt: skip
    assert any(" 404 " in line and "/nowhere" in line for line in lines)
