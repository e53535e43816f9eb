"""What the app's tool layer passes around: a call checked and ready to run (with what a person
needs to approve it), its outcome, and the decision taken on it.

The engine parses calls (`velo_chat.engine.ToolCall`); here they become actions in the session's
working folder (`toolbox.py`), approved by the user or by the profile (`approval.py`), recorded
with their undo data (`undo.py`), one step at a time (`loop.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from velo_chat.engine import ToolCall

ToolKind = Literal["read", "edit", "command"]
"""What a tool does, which decides whether it asks: reads run by default, edits and commands ask."""

Decision = Literal["auto", "allowed", "allowed_session", "refused", "invalid", "stopped"]
"""Who let a call run, or why it did not: `auto` (the profile's `tools.approve` covers it),
`allowed` (the user, once), `allowed_session` (the user, for this tool for the rest of the
session), `refused` (the user said no, maybe with a reason), `invalid` (an unknown tool or bad
arguments: the model is told why), `stopped` (the user stopped the loop before it ran)."""

DECISIONS: Final = ("auto", "allowed", "allowed_session", "refused", "invalid", "stopped")


@dataclass(frozen=True)
class PreparedCall:
    """A call checked against its tool, before it runs: everything the approval shows."""

    call: ToolCall
    kind: ToolKind
    summary: str
    """One line: "read_file src/app.py:10-40", "run_command `pytest -q` in /home/me/proj"."""
    outside: bool = False
    """It touches a path outside the working folder (symlinks resolved): it always asks, and
    `--yes` never covers it."""
    diff: str = ""
    """An edit or a write: the unified diff it would make."""
    command: str = ""
    cwd: str = ""
    paths: tuple[str, ...] = ()
    """The absolute paths it would change (the undo journal records their bytes before)."""
    error: str = ""
    """Why it cannot run (unknown tool, bad arguments, no match for an edit): the model gets
    this as the tool's error and nothing runs."""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    """The arguments, checked and with defaults filled in."""


@dataclass(frozen=True)
class ToolOutcome:
    """What running a call gave: the text the model is told, and facts for the transcript."""

    content: str
    ok: bool = True
    exit_code: int | None = None
    seconds: float = 0.0
    truncated: bool = False
    """The output was longer than `tools.max_output_kib` and was cut (the content says so)."""
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ApprovalAnswer:
    """A person's answer to one call (the TUI's dialog, the CLI's prompt)."""

    decision: Literal["allowed", "allowed_session", "refused", "stopped"]
    reason: str = ""
    """A refusal's reason, told to the model ("" when none was typed)."""
