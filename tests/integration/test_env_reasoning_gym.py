"""`reasoning-gym` against a real gateway in front of the scripted fake engine, with the real
reasoning-gym package: its tasks, its prompt, its verifier's reward (recomputed here with
reasoning-gym alone from the recorded reply), and failures that stay in their episode."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.integration.test_envs import open_session
from tracerl.config.base import ConfigError
from tracerl.config.envs import DatasetConfig
from tracerl.envs import DatasetError, load_dataset, make_environment, run_episode
from tracerl.trace.schema import SessionTrace

reasoning_gym = pytest.importorskip("reasoning_gym")
from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer  # noqa: E402

ARGS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
CONFIG = {"name": "reasoning-gym", "dataset": "chain_sum", "args": ARGS}


def test_train_tasks_are_the_generators_entries_and_eval_is_another_draw() -> None:
    env = make_environment(CONFIG)
    train = env.tasks("train", 20, 3)
    own = reasoning_gym.create_dataset("chain_sum", size=20, seed=3, **ARGS)
    assert [t["question"] for t in train] == [e["question"] for e in own]
    assert [t["answer"] for t in train] == [e["answer"] for e in own]
    assert env.tasks("train", 20, 3) == train  # seeded
    held_out = env.tasks("eval", 20, 3)
    assert [t["question"] for t in held_out] != [t["question"] for t in train]
    for task in train + held_out:
        assert json.loads(json.dumps(task)) == task  # JSON objects, as tasks must be
    # the loop's datasets: `generate = "env"`, the split from the section when unset
    section = DatasetConfig(generate="env", num_tasks=20, seed=3, shuffle=False)
    loaded = load_dataset(section, env.task_fields, env)
    assert [loaded.next().task for _ in range(20)] == train
    loaded = load_dataset(section, env.task_fields, env, default_split="eval")
    assert [loaded.next().task for _ in range(20)] == held_out
    with pytest.raises(DatasetError, match='generate = "env": the guess environment has no'):
        load_dataset(section, (), make_environment({"name": "guess"}))


async def test_the_verifier_scores_the_reply_and_the_trace_scores_it_again(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment(CONFIG)
    tasks = env.tasks("train", 4, 0)
    replies = [
        f"First I add. <answer>{tasks[0]['answer']}</answer>",  # right
        f"<answer>{int(tasks[1]['answer']) + 1}</answer>",  # wrong
        f"The answer is {tasks[2]['answer']}.",  # right number, no tag: no answer
        f"<answer> {tasks[3]['answer']} </answer>",  # reasoning-gym strips the tag's spaces
    ]
    fake.say(*replies)
    sessions = [await open_session(gw) for _ in tasks]
    results = [
        await run_episode(env, task, s, timeout_s=30)
        for task, s in zip(tasks, sessions, strict=True)
    ]
    own = reasoning_gym.create_dataset("chain_sum", size=4, seed=0, **ARGS)
    for task, session, result, entry in zip(tasks, sessions, results, own, strict=True):
        raw = await gw.trace(session.session_id)
        (turn,) = raw["turns"]  # one model call, one recorded turn
        assert turn["request"]["messages"] == [
            {"role": "system", "content": SYSTEM_PROMPTS["default"]},
            {"role": "user", "content": entry["question"]},
        ]
        text = turn["response"]["choices"][0]["message"]["content"]
        expected = own.score_answer(extract_answer(text), entry)  # reasoning-gym alone
        assert (result.reward, result.failed) == (expected, False)
        assert env.reward_fn is not None
        assert env.reward_fn(task, SessionTrace.model_validate(raw)) == expected
    assert [r.reward for r in results] == [1.0, 0.0, 0.0, 1.0]


async def test_a_failing_verifier_fails_its_episode_alone(fake_engine, make_gateway) -> None:
    """reasoning-gym's prime_factorization verifier raises on a reply that is not a product:
    that episode fails with the verifier's error; the one beside it is scored."""
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "reasoning-gym", "dataset": "prime_factorization"})
    task = env.tasks("train", 1, 0)[0]
    with pytest.raises(ValueError) as raised:  # reasoning-gym's own verdict on that reply
        reasoning_gym.create_dataset("prime_factorization").score_answer("xyzzy", task)
    fake.say(f"<answer>{task['answer']}</answer>", "<answer>xyzzy</answer>")
    first, second = await asyncio.gather(
        run_episode(env, task, await open_session(gw), timeout_s=30),
        run_episode(env, task, await open_session(gw), timeout_s=30),
    )
    assert (first.reward, first.failed) == (1.0, False)
    assert (second.reward, second.failed) == (None, True)
    assert second.reason == f"ValueError: {raised.value}"


def test_settings_are_checked_before_any_episode(monkeypatch) -> None:
    with pytest.raises(ConfigError, match="env.dataset: reasoning-gym has no dataset 'nope'"):
        make_environment({"name": "reasoning-gym", "dataset": "nope"})
    with pytest.raises(ConfigError, match="env.args: reasoning-gym's chain_sum: .*'min_animals'"):
        make_environment({**CONFIG, "args": {"min_animals": 2}})
    with pytest.raises(ConfigError, match="env.args: .*max_terms"):
        make_environment({**CONFIG, "args": {"min_terms": 5, "max_terms": 2}})
    with pytest.raises(ConfigError, match="env.prompt_style: .*'direct'"):
        make_environment({**CONFIG, "prompt_style": "loud"})
    monkeypatch.setitem(sys.modules, "reasoning_gym.utils", None)
    with pytest.raises(ConfigError, match=r"pip install 'tracerl\[reasoning-gym\]'"):
        make_environment(CONFIG)


def test_the_prompt_and_the_scripted_reply_follow_the_settings() -> None:
    env = make_environment({**CONFIG, "prompt_style": "direct", "answer_tag": "final"})
    task = env.tasks("train", 1, 0)[0]
    assert env.config.system_prompt == SYSTEM_PROMPTS["direct"]
    assert env.script(task) == f"<final>{task['answer']}</final>"
    assert env.score(task, f"<final>{task['answer']}</final>") == 1.0
    bare = make_environment({**CONFIG, "system_prompt": "", "answer_tag": None})
    assert bare.config.system_prompt is None
    assert bare.score(task, f" {task['answer']}\n") == 1.0  # the whole reply is the answer


def test_a_generator_without_stored_answers_loads_and_scores() -> None:
    """propositional_logic stores no answer (its verifier reads the metadata): its tasks load
    and score, and the scripted policy refuses to demonstrate one."""
    env = make_environment({"name": "reasoning-gym", "dataset": "propositional_logic"})
    section = DatasetConfig(generate="env", num_tasks=3)
    task = load_dataset(section, env.task_fields, env).next().task
    assert task["answer"] is None
    own = reasoning_gym.create_dataset("propositional_logic", size=1, seed=0)
    assert env.score(task, "<answer>P</answer>") == own.score_answer("P", task)
    with pytest.raises(ValueError, match="stores no answer to demonstrate"):
        env.script(task)
