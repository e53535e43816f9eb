"""The tools of one session's working folder: what the model is offered, a call checked into a
`PreparedCall` (what the user approves), and the call run into a `ToolOutcome`.

Nothing a model can send makes this raise: an unknown tool, a tool not offered, wrong or missing
arguments, a path that does not exist or an edit that does not match become a `PreparedCall`
with `error` or an outcome with `ok=False`, one line the model can act on. Only the profile's own
settings (`tools.offered`) raise, when the toolbox is built, since those are the user's to fix.

No UI and no store here: the loop asks for approval (`approval.py`) and records the undo data
around `run`, using `PreparedCall.paths`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from velo_chat.engine import ToolCall, ToolSpec
from velo_chat.engine.config import ToolSettings

from . import command, file_tools, find_tools
from .file_tools import ToolError
from .specs import KINDS, READ_TOOLS, SPECS, TOOL_NAMES, check_arguments
from .types import PreparedCall, ToolKind, ToolOutcome
from .workspace import PathError, Workspace

_Preparer = Callable[[Workspace, ToolSettings, ToolCall, dict[str, Any]], PreparedCall]
_Runner = Callable[[Workspace, ToolSettings, PreparedCall, threading.Event], ToolOutcome]

_PREPARE: dict[str, _Preparer] = {
    "read_file": lambda ws, st, call, args: file_tools.prepare_read(ws, call, args),
    "list_files": lambda ws, st, call, args: find_tools.prepare_list(ws, call, args),
    "search": lambda ws, st, call, args: find_tools.prepare_search(ws, call, args),
    "edit_file": lambda ws, st, call, args: file_tools.prepare_edit(ws, call, args),
    "write_file": lambda ws, st, call, args: file_tools.prepare_write(ws, call, args),
    "run_command": command.prepare_command,
}

_RUN: dict[str, _Runner] = {
    "read_file": lambda ws, st, prepared, cancel: file_tools.run_read(ws, st, prepared),
    "list_files": lambda ws, st, prepared, cancel: find_tools.run_list(ws, st, prepared),
    "search": find_tools.run_search,
    "edit_file": lambda ws, st, prepared, cancel: file_tools.run_edit(ws, prepared),
    "write_file": lambda ws, st, prepared, cancel: file_tools.run_write(ws, prepared),
    "run_command": lambda ws, st, prepared, cancel: command.run_command(st, prepared, cancel),
}


def parse_offered(value: str) -> tuple[str, ...]:
    """The tool names `tools.offered` names, in the tools' own order (so the prompt, and the
    checkpoints made from it, do not change with how the list is spelled). Raises ValueError,
    one line naming the setting, for a name it does not know."""
    chosen: set[str] = set()
    for token in (t.strip() for t in value.split(",")):
        if token == "all":
            chosen.update(TOOL_NAMES)
        elif token == "read-only":
            chosen.update(READ_TOOLS)
        elif token in TOOL_NAMES:
            chosen.add(token)
        else:
            what = f"unknown tool {token!r}" if token else "an empty name"
            raise ValueError(
                f'tools.offered: {what}; use "all", "read-only" or tool names: {", ".join(TOOL_NAMES)}'
            )
    return tuple(name for name in TOOL_NAMES if name in chosen)


class ToolBox:
    """The offered tools working in `root` (the session's working folder) under `settings`."""

    def __init__(self, root: Path, settings: ToolSettings) -> None:
        self.workspace = Workspace(root)
        self.settings = settings
        self.offered = parse_offered(settings.offered)
        self.specs: tuple[ToolSpec, ...] = tuple(SPECS[name] for name in self.offered)

    @property
    def root(self) -> Path:
        return self.workspace.root

    def prepare(self, call: ToolCall) -> PreparedCall:
        """Check `call` and work out what it would do (a diff for an edit or a write), without
        doing it. A call that cannot run comes back with `error` set."""
        name = call.name
        kind = KINDS.get(name, "read")
        if call.error:
            return PreparedCall(call, kind, name or "a malformed call", error=call.error)
        if name not in KINDS:
            return self._invalid(
                call, kind, f"there is no tool {name!r}; the tools are: {', '.join(self.offered)}"
            )
        if name not in self.offered:
            return self._invalid(
                call, kind, f"{name} is not offered in this session; the tools are: {', '.join(self.offered)}"
            )
        args, error = check_arguments(SPECS[name], call.arguments)
        if error:
            return self._invalid(call, kind, error, call.arguments)
        try:
            return _PREPARE[name](self.workspace, self.settings, call, args)
        except (ToolError, PathError) as exc:
            return self._invalid(call, kind, f"{name}: {exc}", args)
        except OSError as exc:
            return self._invalid(call, kind, f"{name}: {_os_error(exc)}", args)

    def run(self, prepared: PreparedCall, cancel: threading.Event) -> ToolOutcome:
        """Do what `prepared` says. Failures are outcomes with `ok=False` (the model is told);
        `cancel` set stops a running command and keeps anything else from starting."""
        name = prepared.call.name
        if prepared.error:
            return ToolOutcome(prepared.error, ok=False)
        if cancel.is_set():
            return ToolOutcome(f"{name}: stopped by the user", ok=False, details={"stopped": "user"})
        started = time.monotonic()
        try:
            outcome = _RUN[name](self.workspace, self.settings, prepared, cancel)
        except (ToolError, PathError) as exc:
            outcome = ToolOutcome(f"{name}: {exc}", ok=False)
        except OSError as exc:
            outcome = ToolOutcome(f"{name}: {_os_error(exc)}", ok=False)
        return dataclasses.replace(outcome, seconds=time.monotonic() - started)

    @staticmethod
    def _invalid(call: ToolCall, kind: ToolKind, error: str, arguments: object = None) -> PreparedCall:
        summary = call.name if call.name in KINDS else f"{call.name or '?'} (unknown tool)"
        checked = dict(arguments) if isinstance(arguments, Mapping) else {}
        return PreparedCall(call, kind, summary, error=error, arguments=checked)


def _os_error(exc: OSError) -> str:
    """An OSError in one line: its reason and the path it is about."""
    reason = exc.strerror or str(exc)
    return f"{reason}: {exc.filename}" if exc.filename else reason
