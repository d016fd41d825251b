"""`files`, the simulated file system, against a real gateway in front of the scripted fake engine,
as the loop runs it: what the model is shown depends on what it listed and read, the episode is
one trajectory, the tools' answers are never in the loss, and only the passcode scores."""

from __future__ import annotations

import json

from tests.fakes import sampled_only, shown_between
from tests.integration.test_envs import open_session
from tracerl.envs import make_environment, run_episode
from tracerl.envs.files import FOLDERS, NUM_FOLDERS, PASSCODE_FILE, answer_call, generate_tasks
from tracerl.trace.schema import SessionTrace

CALL = '<tool_call>\n{{"name": "{}", "arguments": {{"path": "{}"}}}}\n</tool_call>'
FILES = [
    {"path": "docs/todo.txt", "text": "Order 5512 shipped on Monday."},
    {"path": "docs/plan.txt", "text": "Room 2040 is booked for the meeting."},
    {"path": "mail/passcode.txt", "text": "passcode: 4821"},
    {"path": "mail/memo.txt", "text": "The bus leaves at 1730."},
    {"path": "work/list.txt", "text": "Ticket 9001 was closed."},
]
TASK = {"prompt": "Find the passcode.", "answer": 4821, "files": FILES}


def test_the_tools_answer_from_the_task_s_files() -> None:
    def call(name: str, path: object) -> tuple[str, str | None]:
        return answer_call(TASK, name, json.dumps({"path": path}))

    assert call("list_files", "/") == ("docs/ mail/ work/", "list")
    for path in ("mail", "/mail/", "./mail"):  # however the model writes a folder
        assert call("list_files", path) == ("memo.txt passcode.txt", "list")
    assert call("read_file", "/docs/todo.txt") == ("Order 5512 shipped on Monday.", "read")
    assert call("read_file", "mail/passcode.txt") == ("passcode: 4821", PASSCODE_FILE)
    for name, path, error in (
        ("list_files", "music", "error: no folder music"),
        ("list_files", "docs/todo.txt", "error: no folder docs/todo.txt"),
        ("read_file", "mail", "error: no file mail"),
        ("read_file", 7, 'error: expected arguments {"path": "<a folder or file>"}'),
        ("delete", "mail", "error: unknown tool 'delete'; the tools are list_files and read_file"),
    ):
        assert call(name, path) == (error, None), (name, path)
    assert answer_call(TASK, "read_file", "{oops") == (
        "error: the arguments are not valid JSON",
        None,
    )


def test_task_sets_are_seeded_and_each_hides_one_passcode() -> None:
    # bench learn's train set: with ~6 decoys a task, 2 of its 4000 drew the passcode itself
    train, again, held_out = generate_tasks(4000, 0), generate_tasks(4000, 0), generate_tasks(40, 1)
    assert train == again and train != held_out
    hidden_in = set()
    for task in train:
        folders = {f["path"].split("/")[0] for f in task["files"]}
        assert len(folders) == NUM_FOLDERS and folders <= set(FOLDERS)
        (passcode,) = [f for f in task["files"] if f["path"].endswith(f"/{PASSCODE_FILE}")]
        assert passcode["text"] == f"passcode: {task['answer']}"
        others = [f["text"] for f in task["files"] if f is not passcode]
        assert all(str(task["answer"]) not in text for text in others)
        hidden_in.add(sorted(folders).index(passcode["path"].split("/")[0]))
        # `depth`: the passcode folder's place in the top's listing, as the model sees it
        listing = answer_call(task, "list_files", '{"path": "/"}')[0].split()
        assert listing[task["depth"] - 1] == passcode["path"].split("/")[0] + "/"
    assert hidden_in == {0, 1, 2}  # first, second or last in the listing


async def test_a_search_that_reads_the_passcode_is_one_trajectory(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "files", "max_turns": 6})
    fake.say(
        CALL.format("list_files", "/"),
        CALL.format("list_files", "docs"),
        CALL.format("list_files", "mail"),
        CALL.format("read_file", "mail/passcode.txt"),
        "The passcode is 4821.",
    )
    session = await open_session(gw)
    result = await run_episode(env, TASK, session, timeout_s=30)
    assert (result.reward, result.failed) == (1.0, False)
    assert result.metrics == {
        "turns": 5.0, "listings": 3.0, "reads": 1.0, "tool_errors": 0.0, "passcode_read": 1.0,
        "turn_limit": 0.0,
    }  # fmt: skip
    trace = await gw.trace(session.session_id)
    turns = trace["turns"]
    assert [t["parent"] for t in turns] == [None, 0, 1, 2, 3]
    shown = shown_between(turns, fake.tokenizer)  # what each call showed: it depends on the call
    assert ["docs/ mail/ work/" in shown[0], "plan.txt todo.txt" in shown[1]] == [True, True]
    assert ["memo.txt passcode.txt" in shown[2], "passcode: 4821" in shown[3]] == [True, True]
    sampled_only(trace)  # one trajectory; the tools' answers are never trained on
    assert env.reward_fn is not None  # the recorded episode scores the same without the env
    assert env.reward_fn(TASK, SessionTrace.model_validate(trace)) == 1.0


async def test_a_copied_decoy_errors_and_the_turn_limit_score_zero(
    fake_engine, make_gateway
) -> None:
    fake, engine = fake_engine
    gw = await make_gateway(engine)
    env = make_environment({"name": "files", "max_turns": 3})
    fake.say(CALL.format("read_file", "docs/todo.txt"), "The passcode is 5512.")
    decoy = await run_episode(env, TASK, await open_session(gw), timeout_s=30)
    assert (decoy.reward, decoy.metrics["passcode_read"]) == (0.0, 0.0)
    fake.say(
        CALL.format("read_file", "passcode.txt"),
        CALL.format("list_files", "music"),
        CALL.format("read_file", "mail/passcode.txt"),
        "never requested",
    )
    session = await open_session(gw)
    limited = await run_episode(env, TASK, session, timeout_s=30)
    assert limited.reward == 0.0  # read it, but the turns ran out before an answer
    assert limited.metrics == {
        "turns": 3.0, "listings": 0.0, "reads": 1.0, "tool_errors": 2.0, "passcode_read": 1.0,
        "turn_limit": 1.0,
    }  # fmt: skip
    assert len(fake.requests) == 5
    t0, t1, _ = (await gw.trace(session.session_id))["turns"]
    assert "error: no file passcode.txt" in fake.tokenizer.decode(
        t1["prompt_ids"][len(t0["prompt_ids"]) :]
    )
