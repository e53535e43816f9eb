"""run_command (app/tools/command.py) with real shells and processes: output, exit codes, the
output cap, and stopping a whole process group (a child that ignores SIGTERM, a background
grandchild holding the pipe) at the time limit, when the user stops it, and when the shell ends."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from velo_chat.app.tools import ToolBox, command
from velo_chat.engine import ToolCall
from velo_chat.engine.config import ToolSettings

WAIT_S = 60.0  # how long a test waits for a process to reach a point (never reached: a failure)


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "STOP_GRACE_S", 0.3)


def box(root: Path, **settings: object) -> ToolBox:
    return ToolBox(root, ToolSettings(**settings))  # type: ignore[arg-type]


def run(root: Path, line: str, cancel: threading.Event | None = None, **settings: object):
    tools = box(root, **settings)
    prepared = tools.prepare(ToolCall("run_command", {"command": line}))
    assert prepared.error == ""
    return tools.run(prepared, cancel or threading.Event())


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (this machine's pid 1 may never reap orphans)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def group_members(group: int) -> list[int]:
    """Live (not zombie) processes whose process group is `group`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def wait_for(path: Path) -> int:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


# A shell that ignores SIGTERM, with a background grandchild that ignores it too and keeps the
# output pipe open; both would live for five minutes.
STUBBORN = "trap '' TERM; sleep 300 & echo $! > bg.pid; echo started; sleep 300"


def test_output_and_exit_code(tmp_path: Path) -> None:
    outcome = run(tmp_path, "echo out; echo err >&2; pwd; exit 3")
    assert outcome.content == f"out\nerr\n{tmp_path}\nexit code 3"
    assert (outcome.ok, outcome.exit_code) == (False, 3)
    ok = run(tmp_path, "cat")  # no input: cat ends at once
    assert (ok.content, ok.ok, ok.exit_code) == ("(no output)\nexit code 0", True, 0)
    killed = run(tmp_path, "kill -9 $$")
    assert killed.content.endswith("exit code -9 (killed by SIGKILL)") and killed.exit_code == -9


def test_prepare_says_what_runs_where_and_caps_the_time_limit(tmp_path: Path) -> None:
    tools = box(tmp_path, command_timeout_s=30)
    prepared = tools.prepare(ToolCall("run_command", {"command": "make test\nmake lint", "timeout_s": 600}))
    assert (prepared.kind, prepared.command, prepared.cwd, prepared.outside) == (
        "command",
        "make test\nmake lint",
        str(tmp_path),
        False,
    )
    assert prepared.summary == f"run_command `make test ⏎ make lint` in {tmp_path}"
    assert prepared.arguments["timeout_s"] == 30
    assert (
        tools.prepare(ToolCall("run_command", {"command": "ls", "timeout_s": 2})).arguments["timeout_s"] == 2
    )
    assert tools.prepare(ToolCall("run_command", {"command": "ls"})).arguments["timeout_s"] == 30
    assert "the command is empty" in tools.prepare(ToolCall("run_command", {"command": "  "})).error


def test_long_output_keeps_its_head_and_tail(tmp_path: Path) -> None:
    outcome = run(tmp_path, "seq 1 100000", max_output_kib=1)
    assert outcome.truncated and outcome.ok
    lines = outcome.content.splitlines()
    assert lines[:3] == ["1", "2", "3"] and lines[-2:] == ["100000", "exit code 0"]
    assert (
        "... cut: " in outcome.content
        and "bytes in the middle of the output (588,895 bytes in all)" in outcome.content
    )
    assert len(outcome.content.encode()) < 1024 + 200


def test_the_time_limit_stops_the_whole_group(tmp_path: Path) -> None:
    outcome = run(tmp_path, STUBBORN, command_timeout_s=1)
    assert not outcome.ok and outcome.exit_code is None and outcome.details["stopped"] == "timeout"
    assert outcome.content.endswith(
        "timed out after 1 s (the command and everything it started were stopped)"
    )
    assert group_members(outcome.details["pid"]) == []
    pidfile = tmp_path / "bg.pid"
    if pidfile.exists() and pidfile.read_text().strip():  # written unless the machine was very slow
        assert not alive(int(pidfile.read_text()))
        assert outcome.content.startswith("started\n")


def test_the_user_stops_a_command_from_another_thread(tmp_path: Path) -> None:
    cancel = threading.Event()
    pidfile = tmp_path / "bg.pid"
    grandchild: list[int] = []

    def press_escape() -> None:
        grandchild.append(wait_for(pidfile))
        cancel.set()

    presser = threading.Thread(target=press_escape)
    presser.start()
    outcome = run(tmp_path, STUBBORN, cancel, command_timeout_s=WAIT_S * 2)
    presser.join()
    assert not outcome.ok and outcome.details["stopped"] == "user"
    assert outcome.content.startswith("started\n") and "stopped by the user after" in outcome.content
    assert not alive(grandchild[0])
    assert group_members(outcome.details["pid"]) == []


def test_a_background_child_does_not_keep_the_command_running(tmp_path: Path) -> None:
    outcome = run(tmp_path, "sleep 300 & echo $! > bg.pid; echo done", command_timeout_s=WAIT_S)
    assert (outcome.content, outcome.ok, outcome.exit_code) == ("done\nexit code 0", True, 0)
    assert not alive(int((tmp_path / "bg.pid").read_text()))
    assert group_members(outcome.details["pid"]) == []


def test_a_stopped_run_is_never_started(tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    outcome = run(tmp_path, "touch ran", cancel)
    assert outcome.content == "run_command: stopped by the user" and not (tmp_path / "ran").exists()
    assert os.listdir(tmp_path) == []
