"""Asking a person about one tool call, and about files that changed since an edit to undo.

`ToolApprovalDialog` shows what the call would do, in the terms a person checks before saying
yes: an edit or a write as its unified diff, coloured and scrollable; a command as its line and
the folder it runs in; a call that reaches outside the session's working folder says so first,
in a banner. It answers an `ApprovalAnswer`: `y` allows the call once, `a` allows the tool for
the rest of the session, `n` refuses (an optional one-line reason follows, told to the model;
Enter sends it, empty is fine, Esc goes back to the question), Esc stops the whole loop. The keys
are bindings with ids (`approval.*` in `app/keymap.py`), so the help screen lists them and a
keymap can move them.

Nothing in the dialog has focus that Enter would press: the details area takes the focus (the
arrow and page keys scroll a long diff), the buttons are for the mouse. A stray Enter decides
nothing, and neither does a `y`, `a` or `n` that comes in the first moment after the dialog
opened (`ARM_S`): the question can open while the user is typing the next message, and a key
meant for the composer must not allow a command. Esc always works: stopping is always safe.

`UndoConflictDialog` shows the files an undo left alone because they changed since the edit, each
with its diff, and answers whether to put them back anyway.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar, Protocol

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from .. import keymap
from ..tools.types import ApprovalAnswer, PreparedCall
from ..widgets.transcript.tool_block import diff_content

ASKS = {
    "read": "The model asks to read",
    "edit": "The model asks to change files",
    "command": "The model asks to run a command",
}
QUESTION_HINT = "Esc stops the loop · y allow once · a allow {tool} this session · n refuse"
EARLY_HINT = "That key came as the question opened: read it, then press it again"
REASON_HINT = "A reason for the model (optional) · Enter refuses · Esc goes back"


def outside_text(prepared: PreparedCall) -> str:
    """The banner of a call that reaches outside the working folder: what it reaches."""
    where = ", ".join(prepared.paths) or prepared.cwd
    return "⚠ OUTSIDE the working folder" + (f": {where}" if where else "")


class ToolApprovalDialog(ModalScreen[ApprovalAnswer]):
    """One call waiting for the user's word (`ToolApprovalAsked`)."""

    BINDINGS = keymap.bindings("approval")
    ARM_S: ClassVar[float] = 0.4
    """Seconds after opening during which `y`, `a` and `n` are not taken as answers."""

    def __init__(self, prepared: PreparedCall, step: int = 1, *, cursor_blink: bool = True) -> None:
        super().__init__(classes="dialog-screen")
        self.prepared, self.step = prepared, step
        self.cursor_blink = cursor_blink
        self.refusing = False  # the reason line is open
        self._armed_at = 0.0  # time.monotonic() from which the keys answer

    def compose(self) -> ComposeResult:
        p = self.prepared
        classes = "dialog tool-approval" + (" -outside" if p.outside else "") + (" -diff" if p.diff else "")
        with Vertical(classes=classes):
            step = f" · step {self.step}" if self.step > 1 else ""
            yield Static(
                Content(f"{ASKS.get(p.kind, 'The model asks to use a tool')}{step}"), classes="dialog-title"
            )
            if p.outside:
                yield Static(Content(outside_text(p)), id="approval-outside")
            yield Static(Content(p.summary or p.call.name), id="approval-summary")
            with VerticalScroll(id="approval-detail"):
                if p.command:
                    yield Static(Content.styled("$ ", "bold") + Content(p.command), id="approval-command")
                    yield Static(Content(f"in {p.cwd}" if p.cwd else ""), id="approval-cwd")
                if p.diff:
                    yield Static(diff_content(p.diff), id="approval-diff")
                if p.error:
                    yield Static(Content.styled(p.error, "$text-error"), id="approval-error")
            reason = Input(placeholder="why not (optional)", id="approval-reason", compact=True)
            reason.cursor_blink = self.cursor_blink
            reason.display = False
            yield reason
            yield Static(self._question_hint(), id="approval-hint", classes="dialog-hint")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Allow (y)", id="allow", variant="success", compact=True)
                yield Button("For the session (a)", id="allow_session", compact=True)
                yield Button("Refuse (n)", id="refuse", variant="warning", compact=True)
                yield Button("Stop (Esc)", id="stop", variant="error", compact=True)

    def _question_hint(self) -> Content:
        return Content(QUESTION_HINT.format(tool=self.prepared.call.name))

    def on_mount(self) -> None:
        self._armed_at = time.monotonic() + self.ARM_S
        for button in self.query(Button):
            button.can_focus = False  # Enter must never decide: the keys and the mouse do
        detail = self.query_one("#approval-detail", VerticalScroll)
        detail.display = bool(detail.children)
        detail.focus()

    # -- the answers ----------------------------------------------------------------------------

    def _armed(self) -> bool:
        """Whether the keys answer yet (a key that came too early says so on the hint line)."""
        if time.monotonic() >= self._armed_at:
            return True
        self.query_one("#approval-hint", Static).update(EARLY_HINT)
        return False

    def action_allow(self) -> None:
        if self._armed():
            self.dismiss(ApprovalAnswer("allowed"))

    def action_allow_session(self) -> None:
        if self._armed():
            self.dismiss(ApprovalAnswer("allowed_session"))

    def action_refuse(self) -> None:
        """Open the reason line; Enter in it refuses."""
        if not self._armed():
            return
        self.refusing = True
        reason = self.query_one("#approval-reason", Input)
        reason.display = True
        reason.focus()
        self.query_one("#approval-hint", Static).update(REASON_HINT)

    def action_stop(self) -> None:
        """Esc: stop the loop; while a reason is being typed, back to the question."""
        if not self.refusing:
            self.dismiss(ApprovalAnswer("stopped"))
            return
        self.refusing = False
        reason = self.query_one("#approval-reason", Input)
        reason.display = False
        self.query_one("#approval-hint", Static).update(self._question_hint())
        self.query_one("#approval-detail").focus()

    @on(Input.Submitted, "#approval-reason")
    def _refused(self, event: Input.Submitted) -> None:
        self.dismiss(ApprovalAnswer("refused", " ".join(event.value.split())))

    @on(Button.Pressed)
    async def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        await self.run_action(str(event.button.id))


class UndoConflict(Protocol):
    """A file an undo left alone (`velo_chat.app.tools.undo.Conflict`)."""

    @property
    def path(self) -> str: ...

    @property
    def diff(self) -> str: ...


class UndoConflictDialog(ModalScreen[bool]):
    """Files changed since the edit: put them back anyway (True), or keep them (False)."""

    BINDINGS = [Binding("escape", "keep", "Keep the files", id="dialog.cancel")]

    def __init__(self, conflicts: Sequence[UndoConflict], note: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.conflicts, self.note = tuple(conflicts), note

    def compose(self) -> ComposeResult:
        n = len(self.conflicts)
        title = f"{n} file{'' if n == 1 else 's'} changed since the edit"
        with Vertical(classes="dialog tool-approval -diff -conflicts"):
            yield Static(Content(title), classes="dialog-title")
            text = (
                "They were left as they are now. The diffs run from what the edit left to the file "
                "now; restoring anyway loses those changes."
            )
            yield Static(Content(f"{self.note} {text}".strip()), classes="dialog-body")
            with VerticalScroll(id="approval-detail"):
                for conflict in self.conflicts:
                    yield Static(Content.styled(conflict.path, "bold"), classes="conflict-path")
                    yield Static(diff_content(conflict.diff), classes="conflict-diff")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Restore anyway", id="force", variant="error", compact=True)
                yield Button("Keep them (Esc)", id="keep", compact=True)

    def on_mount(self) -> None:
        self.query_one("#approval-detail").focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "force")

    def action_keep(self) -> None:
        self.dismiss(False)
