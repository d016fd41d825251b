"""`files`: find a passcode in a small simulated file system with two tools, through the official
openai SDK; what the agent sees next depends on which folders it listed and which files it read.

The task's file system is a few folders at the top, each holding a few text files; one folder
holds `passcode.txt`, whose text gives a 4-digit passcode, and the other files hold numbers of
their own (so a number copied from anywhere else is wrong). The tools are `list_files(path)`
(a folder's entries, folders with a trailing `/`; "/" is the top) and `read_file(path)` (a
file's text). The episode ends with a reply without tool calls, scored 1 when its final answer
(the last number, as `arithmetic` reads it) is the passcode, or after `max_turns` model turns,
which scores 0. A call that names no folder or file, or another tool, is answered `error: ...`
and costs its turn. The scripted policy lists the top, then each folder in listed order until
one holds `passcode.txt`, reads it and answers: 4 to 6 turns with three folders.

Task fields: `prompt`, `answer` (the passcode) and `files` (a list of `{"path", "text"}`: flat
rows, so the task reads as a table in Parquet or `datasets` too). `generate_tasks` draws 3
folders of 2-3 files each, the passcode's folder and every name and number at random; held-out
sets are other seeds. Its tasks also say how deep the search goes, `depth`: the passcode
folder's place in the listing (1-3; the scripted search takes `depth + 3` turns), the field
difficulty-aware drawing can measure over (`dataset.difficulty_by = "depth"`).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from tracerl.config.envs import FilesEnvConfig
from tracerl.envs.base import EnvResult, Session, Task, TraceReward
from tracerl.envs.chat import Script, call_arguments, function_tool, play_with_tools, tool_call
from tracerl.envs.rewards import exact_answer_reward, from_final_text

LIST_TOOL: Any = function_tool(
    "list_files",
    "List a folder's entries; folders end with /.",
    "path",
    "string",
    'the folder, for example "/" or "docs"',
)
READ_TOOL: Any = function_tool(
    "read_file", "Read a text file.", "path", "string", 'the file, for example "docs/todo.txt"'
)
TOOLS = (LIST_TOOL, READ_TOOL)
PASSCODE_FILE = "passcode.txt"
PROMPT = (
    f"One of the folders on this computer holds a file named {PASSCODE_FILE}. Find it with the "
    "list_files and read_file tools, then reply with the passcode written in it."
)
FOLDERS = ("docs", "logs", "notes", "mail", "backup", "music", "photos", "work", "games", "tmp")
FILE_NAMES = ("todo.txt", "readme.txt", "draft.txt", "plan.txt", "list.txt", "memo.txt")
DECOYS = (
    "Call the office at extension {n}.",
    "Order {n} shipped on Monday.",
    "Room {n} is booked for the meeting.",
    "Invoice {n} is still unpaid.",
    "The bus leaves at {n}.",
    "Ticket {n} was closed.",
)
NUM_FOLDERS = 3


def generate_tasks(num_tasks: int, seed: int) -> list[Task]:
    rng = random.Random(f"tracerl.files:{seed}")
    tasks: list[Task] = []
    for _ in range(num_tasks):
        folders = sorted(rng.sample(FOLDERS, NUM_FOLDERS))
        hidden = rng.choice(folders)
        passcode = rng.randint(1000, 9999)
        files = []
        for folder in folders:
            names = rng.sample(FILE_NAMES, rng.randint(2, 3))
            if folder == hidden:
                names[-1] = PASSCODE_FILE
            for name in sorted(names):
                text = f"passcode: {passcode}"
                if name != PASSCODE_FILE:
                    template, decoy = rng.choice(DECOYS), rng.randint(1000, 9999)
                    if decoy == passcode:  # the next number instead: no draw more, so the
                        decoy = 1000 + (decoy - 999) % 9000  # other tasks stay as they were
                    text = template.format(n=decoy)
                files.append({"path": f"{folder}/{name}", "text": text})
        depth = folders.index(hidden) + 1  # the top lists the folders sorted, as here
        tasks.append({"prompt": PROMPT, "answer": passcode, "files": files, "depth": depth})
    return tasks


def _normal(path: Any) -> str | None:
    """`path` as `folder` or `folder/file` ("" for the top), whichever slashes it has; None
    when it is not a string."""
    if not isinstance(path, str):
        return None
    return "/".join(part for part in path.strip().split("/") if part not in ("", "."))


def answer_call(task: Task, name: str, arguments: str) -> tuple[str, str | None]:
    """The tool's answer to one call, and what it showed: "list", "read", PASSCODE_FILE (the
    passcode's file was read) or None (an error)."""
    args = call_arguments(("list_files", "read_file"), name, arguments)
    if isinstance(args, str):
        return args, None
    path = _normal(args.get("path"))
    if path is None:
        return 'error: expected arguments {"path": "<a folder or file>"}', None
    texts = {f["path"]: f["text"] for f in task["files"]}
    if name == "read_file":
        if path not in texts:
            return f"error: no file {path}", None
        return texts[path], PASSCODE_FILE if path.endswith(f"/{PASSCODE_FILE}") else "read"
    prefix, entries = f"{path}/" if path else "", set()
    for p in texts:
        if p.startswith(prefix):
            head, folder, _ = p[len(prefix) :].partition("/")
            entries.add(head + folder)  # a folder keeps its "/"
    if not entries:
        return f"error: no folder {path}", None
    return " ".join(sorted(entries)), "list"


def script(task: Task) -> Script:
    """The scripted policy: list the top, then each folder in listed order until one holds the
    passcode's file, read it, and state the passcode."""

    def reply(messages: list[Any]) -> dict[str, Any]:
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if not results:
            return tool_call("list_files", {"path": "/"})
        folders = [e.rstrip("/") for e in results[0].split()]
        if results[-1].startswith("passcode:"):
            return {"role": "assistant", "content": f"The passcode is {results[-1].split()[-1]}."}
        listed = len(results) - 1
        if listed and PASSCODE_FILE in results[-1].split():
            return tool_call("read_file", {"path": f"{folders[listed - 1]}/{PASSCODE_FILE}"})
        return tool_call("list_files", {"path": folders[listed]})

    return reply


class FilesEnvironment:
    name = "files"
    demonstrable = True  # `script` plays it in demonstration sessions
    task_fields: tuple[str, ...] = ("prompt", "answer", "files")

    def __init__(self, config: FilesEnvConfig) -> None:
        self.config = config
        self.reward_fn: TraceReward | None = from_final_text(exact_answer_reward)

    async def run(self, task: Task, session: Session) -> EnvResult:
        counts: Counter[str] = Counter()

        def answer(name: str | None, arguments: str) -> str:
            if name is None:
                content, shown = "error: only function tools are supported", None
            else:
                content, shown = answer_call(task, name, arguments)
            counts[shown or "error"] += 1
            return content

        c = self.config
        play = await play_with_tools(
            session, c, str(task["prompt"]), list(TOOLS), c.max_turns, answer, script(task)
        )
        reward = 0.0
        if play.final_text is not None:
            reward = exact_answer_reward(task, play.final_text)
        metrics = {
            "turns": float(play.turns),
            "listings": float(counts["list"]),
            "reads": float(counts["read"] + counts[PASSCODE_FILE]),
            "tool_errors": float(counts["error"]),
            "passcode_read": float(counts[PASSCODE_FILE] > 0),
            "turn_limit": float(play.turn_limit),
        }
        return EnvResult(reward, metrics)
