"""`verifiers` against a real gateway in front of the scripted fake engine, with the real
verifiers package and an environment of the tests' own loaded by id
(`tests/envpkgs/vf_tracerl_toy.py`): its rollout logic plays every kind of episode through the
session, every model call is a recorded turn of one trajectory, and its rubric's reward is
recomputed here by verifiers alone from the recorded transcript."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import sampled_only
from tests.integration.test_envs import open_session
from tracerl.config.base import ConfigError
from tracerl.envs import make_environment, run_episode

pytestmark = pytest.mark.envs  # `make test-envs` installs verifiers
vf = pytest.importorskip("verifiers")

PACKAGES = Path(__file__).parents[1] / "envpkgs"
TOOL_CALL = '<tool_call>\n{{"name": "add", "arguments": {{"a": {}, "b": {}}}}}\n</tool_call>'


@pytest.fixture(autouse=True)
def installed(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(PACKAGES))  # what `pip install` of the module would do


def environment(kind: str, **config: Any) -> Any:
    return make_environment(
        {"name": "verifiers", "id": "vf-tracerl-toy", "args": {"kind": kind}, **config}
    )


async def rubric_reward(env: Any, task: dict[str, Any], raw: dict[str, Any]) -> float:
    """verifiers alone: the recorded transcript (the last turn's messages and reply, past the
    task's prompt) scored by a fresh load of the environment's rubric."""
    last = raw["turns"][-1]
    messages = [*last["request"]["messages"], last["response"]["choices"][0]["message"]]
    own = vf.load_environment("vf-tracerl-toy", kind=env.config.args["kind"])
    state = vf.State(input=dict(task))
    state.update(
        prompt=task["prompt"], completion=messages[len(task["prompt"]) :],
        answer=task["answer"], task="default", info={}, trajectory=[],
    )  # fmt: skip
    await own.rubric.score_rollout(state)
    return float(state["reward"])


@pytest.mark.parametrize(
    ("kind", "replies", "reward", "turns"),
    [
        ("single", ["3"], 1.0, 1),
        ("single", ["4"], 0.0, 1),
        ("tool", [TOOL_CALL.format(1, 2), "3"], 1.0, 2),
        ("multi", ["5", "3"], 1.0, 2),
        ("multi", ["5", "6", "7"], 0.0, 3),
    ],
)
async def test_each_kind_plays_through_the_session_and_the_rubric_scores_it(
    kind: str, replies: list[str], reward: float, turns: int, fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = environment(kind, sampling={"temperature": 0.5, "max_tokens": 40})
    task = env.tasks("train", None, 0)[0]
    assert task["answer"] == "3" and json.loads(json.dumps(task)) == task
    fake.say(*replies)
    session = await open_session(gw)
    result = await run_episode(env, task, session, timeout_s=30)
    assert (result.reward, result.failed) == (reward, False)
    assert result.metrics["exact_answer"] == reward
    raw = await gw.trace(session.session_id)
    assert len(raw["turns"]) == len(fake.requests) == turns  # no call unrecorded, none retried
    params = [r["sampling_params"] for r in fake.requests]
    assert {(p["temperature"], p["max_new_tokens"]) for p in params} == {(0.5, 40)}
    sampled_only(raw)  # one trajectory; tool results and the environment's words are context
    assert await rubric_reward(env, task, raw) == reward
    if kind == "tool":
        second = raw["turns"][1]["request"]["messages"]
        assert second[-1]["role"] == "tool" and second[-1]["content"] == "3"
    if kind == "multi":
        assert raw["turns"][1]["request"]["messages"][-1]["content"] == "wrong, try again"


async def test_errors_fail_their_episode_with_verifiers_message(fake_engine, make_gateway) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine, max_model_len=512)
    multi = environment("multi")
    task = multi.tasks("train", None, 0)[0]
    fake.say("explode")
    broke = await run_episode(multi, task, await open_session(gw), timeout_s=30)
    assert broke.failed and broke.reason is not None
    assert "verifiers vf-tracerl-toy: ToolError: the environment broke" in broke.reason
    # a gateway refusal (a prompt past the model's context) is the episode's error too
    long_task = {**task, "prompt": [{"role": "user", "content": "word " * 5000}]}
    refused = await run_episode(multi, long_task, await open_session(gw), timeout_s=30)
    assert refused.failed and refused.reason is not None
    assert "verifiers vf-tracerl-toy: " in refused.reason and "context" in refused.reason
    fake.say("3")
    fine = await run_episode(multi, task, await open_session(gw), timeout_s=30)
    assert (fine.reward, fine.failed) == (1.0, False)


def test_datasets_and_settings(monkeypatch) -> None:
    env = environment("single")
    train, held_out = env.tasks("train", None, 0), env.tasks("eval", None, 0)
    assert (len(train), len(held_out)) == (40, 10)
    assert {t["answer"] for t in train}.isdisjoint({t["answer"] for t in held_out})
    some = env.tasks("train", 5, 7)
    assert len(some) == 5 and some == env.tasks("train", 5, 7) and some != train[:5]
    with pytest.raises(ConfigError, match="has no eval dataset"):
        make_environment(
            {"name": "verifiers", "id": "vf-tracerl-toy", "args": {"eval_rows": False}}
        ).tasks("eval", None, 0)
    with pytest.raises(ConfigError, match="env.id: .*vf-no-such-env"):
        make_environment({"name": "verifiers", "id": "vf-no-such-env"})
    with pytest.raises(ConfigError, match="env.args: .*'vf-tracerl-toy': no kind 'zzz'"):
        environment("zzz")
    import sys

    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ConfigError, match=r"pip install 'tracerl\[verifiers\]'"):
        environment("single")
