"""run_command: a shell command in the working folder that can always be stopped.

The command runs in its own session and process group (`start_new_session`), with no input and
no controlling terminal, so an editor or a password prompt it starts fails at once instead of
taking over the TUI's terminal. Its stdout and stderr come through one pipe, read by a thread into
a head-and-tail buffer, so a command printing gigabytes costs bounded memory.

Stopping is about the group, not the shell: when the user presses Esc (`cancel`), at the time
limit, and also when the shell ends normally, whatever is left in the group gets SIGTERM, then
SIGKILL after a short grace. A child that ignores SIGTERM dies all the same, and a background
child that still holds the pipe cannot keep the tool waiting for end-of-file forever. (A process
that left the group on purpose, with its own `setsid`, is out of reach; if it still holds the
pipe, the output is returned as far as it came and says so.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from typing import IO, Any

from velo_chat.engine import ToolCall
from velo_chat.engine.config import ToolSettings

from .file_tools import ToolError
from .output import HeadTail, shorten
from .types import PreparedCall, ToolOutcome
from .workspace import Workspace

STOP_GRACE_S = 2.0
"""Between SIGTERM and SIGKILL: long enough for a test runner to write its summary and clean up."""
POLL_S = 0.05
"""How often the wait looks at the process and the stop flag."""
READER_JOIN_S = 2.0
"""How long to wait for the pipe's end once every process of the group is gone."""
READ_CHUNK = 65536


def prepare_command(
    ws: Workspace, settings: ToolSettings, call: ToolCall, args: dict[str, Any]
) -> PreparedCall:
    command: str = args["command"]
    if not command.strip():
        raise ToolError("the command is empty")
    limit = settings.command_timeout_s
    asked = args.get("timeout_s")
    if asked is not None and asked <= 0:
        raise ToolError("timeout_s must be more than 0 seconds")
    args["timeout_s"] = limit if asked is None else min(asked, limit)
    cwd = str(ws.root)
    one_line = " ⏎ ".join(line for line in command.strip().splitlines() if line.strip())
    return PreparedCall(
        call,
        "command",
        f"run_command `{shorten(one_line, 200)}` in {cwd}",
        command=command,
        cwd=cwd,
        arguments=args,
    )


def run_command(settings: ToolSettings, prepared: PreparedCall, cancel: threading.Event) -> ToolOutcome:
    """Run the prepared command to its end, its time limit or `cancel`, whichever comes first."""
    timeout_s = float(prepared.arguments["timeout_s"])
    buffer = HeadTail(settings.max_output_kib * 1024)
    lock = threading.Lock()
    shell = shutil.which("bash") or "/bin/sh"
    started = time.monotonic()
    proc = subprocess.Popen(
        [shell, "-c", prepared.command],
        cwd=prepared.cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=_environment(),
    )
    assert proc.stdout is not None
    reader = threading.Thread(
        target=_drain, args=(proc.stdout, buffer, lock), name="run_command-output", daemon=True
    )
    reader.start()
    stopped = ""
    deadline = started + timeout_s
    while proc.poll() is None:
        if cancel.is_set():
            stopped = "user"
            break
        left = deadline - time.monotonic()
        if left <= 0:
            stopped = "timeout"
            break
        cancel.wait(min(POLL_S, left))
    stop_group(proc)
    reader.join(READER_JOIN_S)
    seconds = time.monotonic() - started
    with lock:
        output = buffer.text()
        truncated = buffer.truncated
        total = buffer.total
    lines = [output.rstrip("\n")] if output.strip() else ["(no output)"]
    if reader.is_alive():
        lines.append("(the output may be incomplete: a process outside the command's group still holds it)")
    details: dict[str, Any] = {"output_bytes": total, "pid": proc.pid}
    if stopped:
        details["stopped"] = stopped
        if stopped == "user":
            lines.append(f"stopped by the user after {seconds:.1f} s")
        else:
            lines.append(
                f"timed out after {timeout_s:g} s (the command and everything it started were stopped)"
            )
        return ToolOutcome("\n".join(lines), ok=False, truncated=truncated, details=details)
    code = proc.returncode
    lines.append(f"exit code {code}{_signal_note(code)}")
    return ToolOutcome("\n".join(lines), ok=code == 0, exit_code=code, truncated=truncated, details=details)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """End every process left in `proc`'s group: SIGTERM, up to `STOP_GRACE_S` for them to go,
    then SIGKILL; reap `proc` itself. Returns at once when the group is already empty."""
    group = proc.pid
    if not _signal_group(group, signal.SIGTERM):
        proc.wait()
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        proc.poll()  # reap the shell, so it does not count as alive
        if not _group_alive(group):
            break
        time.sleep(POLL_S / 2)
    _signal_group(group, signal.SIGKILL)
    proc.wait()


def _signal_group(group: int, sig: int) -> bool:
    """Send `sig` to the group; False when it has no process left."""
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member changed user (setuid): it still exists
    return True


def _group_alive(group: int) -> bool:
    return _signal_group(group, 0)


def _drain(stream: IO[bytes], buffer: HeadTail, lock: threading.Lock) -> None:
    fd = stream.fileno()
    try:
        while data := os.read(fd, READ_CHUNK):
            with lock:
                buffer.add(data)
    except OSError:
        pass
    finally:
        stream.close()


def _environment() -> dict[str, str]:
    """The user's environment, with pagers off and git's password prompt off: there is nobody at
    the command's input to page or type."""
    env = dict(os.environ)
    env.update({"PAGER": "cat", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0"})
    return env


def _signal_note(code: int) -> str:
    if code >= 0:
        return ""
    try:
        return f" (killed by {signal.Signals(-code).name})"
    except ValueError:
        return f" (killed by signal {-code})"
