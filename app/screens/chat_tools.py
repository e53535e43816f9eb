"""The chat screen's side of tool calling: approvals, the steps in the transcript, `/undo`.

`ToolSteps` is owned by the chat screen, whose handlers of the generation worker's tool messages
call it (app/generation_tools.py posts them):

- Each turn gets its session's `ApprovalPolicy` (`policy`), so a tool allowed "for the
  session" (`a`) runs without asking in that session's later turns too.
- `ToolApprovalAsked`: the call's block says it waits, and the approval dialog
  (`app/dialogs/tool_approval.py`) asks; its answer is the worker's (`Future.set_result`). The
  worker never stays blocked: a turn that ends, or a screen that goes away, answers every open
  question "stopped" (`stop_waiting`).
- `ToolCallDone`: the reply's blocks show the calls and the results so far, and the live panel
  the step and where the turn's time went.
- `ToolStepBegan`: the model answers again after a step; a new reply joins the transcript, as
  the first one did when the turn began, and the turn's stream goes to it (`TurnView.reply`).

`/undo [N]` (typed as a message, as `/read` is) puts back the files the session's tool calls
changed: the last turn's edits, or turn N's and later ones' (N is the position of the message
that started the turn). Revising an earlier message (`e`) first offers to undo the edits made
after it, so the fork starts from the files as they were. Either runs in a thread under the
session's writer lock (`app/tools/undo.py`); files changed since the edit are left alone and shown
with their diff, to restore anyway or keep.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual.app import App

from velo_chat.engine.config import ToolSettings
from velo_chat.store import Message as StoredMessage
from velo_chat.store import Session, SessionStore, StoreError
from velo_chat.store.models import StoredToolCall

from ..dialogs.choice import ChoiceDialog
from ..dialogs.tool_approval import ToolApprovalDialog, UndoConflictDialog
from ..errors import UserError
from ..messages import ToolApprovalAsked, ToolCallDone, ToolStepBegan
from ..tools.approval import ApprovalPolicy
from ..tools.types import ApprovalAnswer, PreparedCall
from ..tools.undo import UndoOutcome, edits_after, revert, undo
from ..widgets.telemetry.panel import LivePanel
from ..widgets.transcript.message import MessageView
from ..widgets.transcript.tool_block import Pending
from ..widgets.transcript.transcript import Transcript
from .chat_turn import TurnView

log = logging.getLogger(__name__)

UNDO_COMMAND = "/undo"
STOPPED = ApprovalAnswer("stopped")
NAMES_SHOWN = 6  # paths named in an undo's notice (the rest are counted)


@dataclass(frozen=True)
class UndoAsked:
    """`/undo [N]`: the turn to undo from (None: the last turn that edited files)."""

    turn: int | None


def parse_undo(text: str) -> UndoAsked | None:
    """The `/undo [N]` typed as a message, or None when `text` is not that command; a bad N
    raises `UserError`."""
    words = text.split()
    if not words or words[0] != UNDO_COMMAND:
        return None
    if len(words) == 1:
        return UndoAsked(None)
    if len(words) == 2 and words[1].isdigit():
        return UndoAsked(int(words[1]))
    raise UserError(
        f"{UNDO_COMMAND} takes at most one number: the position of the message that started the "
        f"turn to undo from ({UNDO_COMMAND} alone undoes the last turn that changed files)"
    )


def outcome_line(outcome: UndoOutcome, base: Path) -> str:
    """The notice after an undo: what was put back and what removed, paths relative to `base`
    where they are inside it."""
    parts = []
    for verb, paths in (("restored", outcome.restored), ("removed", outcome.removed)):
        if paths:
            shown = [_shown_path(p, base) for p in paths[:NAMES_SHOWN]]
            more = f" and {len(paths) - NAMES_SHOWN} more" if len(paths) > NAMES_SHOWN else ""
            parts.append(f"{verb} {', '.join(shown)}{more}")
    return "Undone: " + "; ".join(parts) + "." if parts else ""


def _shown_path(path: str, base: Path) -> str:
    try:
        return str(Path(path).relative_to(base))
    except ValueError:
        return path


class ToolSteps:
    """The running turn's tool steps as they show, and the undo commands."""

    def __init__(
        self,
        app: App[Any],
        *,
        store: Callable[[], SessionStore],
        transcript: Callable[[], Transcript],
        panel: Callable[[], LivePanel],
        turn_view: TurnView,
        session: Callable[[], Session | None],
        busy: Callable[[], bool],
        base: Callable[[], Path],
        give_back: Callable[[str], None],
        run_worker: Callable[..., object],
        show_thinking: Callable[[], bool],
        cursor_blink: bool = True,
    ) -> None:
        """`base`: the session's working folder (paths are shown relative to it); `give_back`
        puts a command that could not run back in the composer; `run_worker` is the screen's."""
        self._app = app
        self._store = store
        self._transcript = transcript
        self._panel = panel
        self._turn_view = turn_view
        self._session = session
        self._busy = busy
        self._base = base
        self._give_back = give_back
        self._run_worker = run_worker
        self._show_thinking = show_thinking
        self._cursor_blink = cursor_blink
        self._asked: dict[concurrent.futures.Future[ApprovalAnswer], ToolApprovalDialog] = {}
        self._pending: dict[int, Pending] = {}  # the calls of `_pending_view` with no result yet
        self._pending_view: MessageView | None = None
        self._closing = threading.Event()  # the screen goes away: an undo waiting for the lock gives up
        # by session id, with the settings each was made from
        self._policies: dict[str, tuple[ToolSettings, ApprovalPolicy]] = {}
        # a new session's, until a call of its first turn names the session
        self._unbound: tuple[ToolSettings, ApprovalPolicy] | None = None

    # -- the session's approvals ------------------------------------------------------------------

    def policy(self, session: Session | None, settings: ToolSettings) -> ApprovalPolicy:
        """The approval state for a turn of `session` (None: a new one, whose policy is kept under
        its id once a call of its first turn is done). A profile whose `[tools]` changed gets a
        new policy that keeps the tools already allowed for the session."""
        kept = self._policies.get(session.id) if session is not None else None
        if kept is not None and kept[0] == settings:
            return kept[1]
        policy = ApprovalPolicy(settings)
        for tool in kept[1].allowed_for_session if kept is not None else ():
            policy.allow_for_session(tool)
        if session is None:
            self._unbound = (settings, policy)
        else:
            self._policies[session.id] = (settings, policy)
        return policy

    # -- approvals ------------------------------------------------------------------------------

    async def approval_asked(self, msg: ToolApprovalAsked) -> None:
        """Show the call as waiting and ask; the answer goes to the worker."""
        future = msg.answer
        if future.done():  # the worker gave up already (the turn was stopped)
            return
        view = self._turn_view.reply
        index = await self._mark(view, msg.prepared) if view is not None else None
        dialog = ToolApprovalDialog(msg.prepared, msg.step, cursor_blink=self._cursor_blink)
        self._asked[future] = dialog

        async def answered(answer: ApprovalAnswer | None) -> None:
            self._asked.pop(future, None)
            _answer(future, answer or STOPPED)
            if view is None or index is None or view is not self._pending_view:
                return
            if answer is not None and answer.decision in ("allowed", "allowed_session"):
                self._pending[index] = Pending(False, msg.prepared)
            else:
                self._pending.pop(index, None)
            await view.show_tools(view.tool_calls, view.tool_results, self._pending)

        self._app.push_screen(dialog, answered)

    async def _mark(self, view: MessageView, prepared: PreparedCall) -> int:
        """Show `prepared`'s call in `view` as waiting for approval; its index in the reply."""
        if view is not self._pending_view:
            self._pending, self._pending_view = {}, view
        stored = self._stored(view) if view.streaming or not view.tool_calls else None
        if stored is not None and stored.tool_calls:
            await view.show_step(stored, self._pending)
        elif view.streaming:  # the stored row says nothing yet: the text as it streamed
            await view.finish(view.text, "complete", view.message_id, view.reasoning)
        calls = list(view.tool_calls)
        call = prepared.call
        index = next((i for i, c in enumerate(calls) if call.id and c.id == call.id), None)
        if index is None:  # not stored yet: shown from the call as checked
            index = len(calls)
            calls.append(StoredToolCall(call.id, call.name, dict(call.arguments), call.text, call.error))
        self._pending[index] = Pending(True, prepared)
        await view.show_tools(calls, view.tool_results, self._pending)
        return index

    def _stored(self, view: MessageView) -> StoredMessage | None:
        if view.message_id is None:
            return None
        try:
            return self._store().get_message(view.message_id)
        except StoreError:
            log.warning("could not read reply %s", view.message_id, exc_info=True)
            return None

    def stop_waiting(self) -> None:
        """Answer every open question "stopped" and close its dialog: the turn ended, or the
        screen goes away. The worker must never be left waiting."""
        for future, dialog in list(self._asked.items()):
            _answer(future, STOPPED)
            if dialog.is_current:
                dialog.dismiss(STOPPED)
        self._asked.clear()

    def close(self) -> None:
        """The screen goes away: no question stays open, no undo waits for the lock."""
        self._closing.set()
        self.stop_waiting()

    # -- steps ----------------------------------------------------------------------------------

    async def step_began(self, msg: ToolStepBegan) -> None:
        """A new reply for the next step, which the turn's stream now fills."""
        previous = self._turn_view.reply
        if previous is not None:
            await self._settle(previous)
        transcript = self._transcript()
        transcript.freeze_history()
        view = await transcript.add_message(
            MessageView(
                "assistant", streaming=True, show_thinking=self._show_thinking(), message_id=msg.reply.id
            )
        )
        self._turn_view.reply = view
        self._panel().tool_step_began()

    async def call_done(self, msg: ToolCallDone) -> None:
        """The reply's calls and results so far; the step and the turn's times in the panel."""
        self._panel().tool_steps(msg.step, msg.model_s, msg.tool_s)
        if self._unbound is not None and msg.reply.session_id not in self._policies:
            self._policies[msg.reply.session_id], self._unbound = self._unbound, None
        view = self._view_of(msg.reply)
        if view is None:
            return
        pending: dict[int, Pending] = {}
        if view is self._pending_view:
            done = {r.call_index for r in msg.reply.tool_results}
            self._pending = pending = {i: p for i, p in self._pending.items() if i not in done}
        await view.show_step(msg.reply, pending)

    def _view_of(self, reply: StoredMessage) -> MessageView | None:
        current = self._turn_view.reply
        if current is not None and current.message_id in (reply.id, None):
            return current
        return next((v for v in self._transcript().views() if v.message_id == reply.id), None)

    async def turn_ended(self) -> None:
        """No question stays open, and no call still says it waits or runs."""
        self.stop_waiting()
        view, self._pending_view = self._pending_view, None
        self._pending = {}
        if view is not None and view.is_mounted:
            await view.show_tools(view.tool_calls, view.tool_results)

    async def _settle(self, view: MessageView) -> None:
        """A step is over: its reply stops streaming and its calls stop saying they run."""
        if view.streaming:
            await view.finish(view.text, "complete", view.message_id, view.reasoning)
        if view is self._pending_view:
            self._pending, self._pending_view = {}, None
            await view.show_tools(view.tool_calls, view.tool_results)

    # -- undo -----------------------------------------------------------------------------------

    def undo_command(self, text: str) -> bool:
        """`/undo [N]` typed as a message: undo, or say why not (the text goes back to the
        composer). False when `text` is not the command."""
        try:
            asked = parse_undo(text)
        except UserError as exc:
            self._give_back(text)
            self._app.notify(str(exc), severity="warning", timeout=8)
            return True
        if asked is None:
            return False
        session = self._session()
        if session is None:
            self._app.notify("Nothing to undo: this session has no turn yet.", severity="warning")
            return True
        if self._busy():
            self._give_back(text)
            self._app.notify(
                "Undo waits for the reply to end: its tools may be changing the same files.",
                severity="warning",
            )
            return True
        turn = asked.turn
        self._undo(session, lambda force: undo(self._store(), session.id, turn=turn, force=force))
        return True

    def offer_undo_before(self, position: int) -> None:
        """A revision of message `position` is being written: when tool calls changed files
        after it, offer to put them back first (the fork starts before those edits)."""
        session = self._session()
        if session is None or self._busy():  # a revision is not sent while a turn runs
            return
        try:
            edits = edits_after(self._store(), session.id, position)
        except (StoreError, UserError):
            log.warning("could not list the edits after message %s", position, exc_info=True)
            return
        paths = list(dict.fromkeys(e.path for e in edits))
        if not paths:
            return
        base = self._base()
        shown = ", ".join(_shown_path(p, base) for p in paths[:NAMES_SHOWN])
        more = f" and {len(paths) - NAMES_SHOWN} more" if len(paths) > NAMES_SHOWN else ""
        noun = "file" if len(paths) == 1 else "files"
        title = (
            f"After this message the model changed {len(paths)} {noun}: {shown}{more}. "
            "Put them back as they were before you revise it?"
        )

        def chosen(choice: str | None) -> None:
            if choice == "undo":
                self._undo(session, lambda force: self._revert_after(session.id, position, force))

        self._app.push_screen(
            ChoiceDialog(
                title,
                [("undo", "Undo those edits first"), ("keep", "Keep the files as they are now")],
                current="keep",
            ),
            chosen,
        )

    def _revert_after(self, session_id: str, position: int, force: bool) -> UndoOutcome:
        store = self._store()
        return revert(store, edits_after(store, session_id, position), force=force)

    def _undo(self, session: Session, run: Callable[[bool], UndoOutcome]) -> None:
        """Run `run` in a thread under the session's writer lock, then say what it did; files
        changed since the edit are shown, to restore anyway (`run(True)`) or keep."""

        async def work(force: bool) -> None:
            try:
                outcome = await asyncio.to_thread(self._locked, session.id, lambda: run(force))
            except (UserError, StoreError, OSError) as exc:
                self._app.notify(f"Undo failed: {exc}", severity="error", timeout=10)
                return
            line = outcome_line(outcome, self._base())
            if line:
                self._app.notify(line, timeout=8)
            elif outcome.nothing:
                self._app.notify("Nothing to undo: no file changed by a tool is left to put back.")
            if outcome.conflicts and not force:
                self._app.push_screen(UndoConflictDialog(outcome.conflicts), again)

        def again(force: bool | None) -> None:
            if force:
                self._start(work(True))

        self._start(work(False))

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        self._run_worker(work, group="undo", exclusive=True)

    def _locked(self, session_id: str, run: Callable[[], UndoOutcome]) -> UndoOutcome:
        """In a thread: `run` as the session's only writer (waiting for another process's turn
        says so)."""

        def waiting(holder: str) -> None:
            self._app.call_from_thread(
                self._app.notify, f"Undo waits: {holder} is taking a turn in this session.", timeout=5
            )

        with self._store().writer(session_id, on_wait=waiting, cancel=self._closing):
            return run()


def _answer(future: concurrent.futures.Future[ApprovalAnswer], answer: ApprovalAnswer) -> None:
    """Give the worker its answer, unless it stopped waiting (it cancels the future then)."""
    try:
        if not future.done():
            future.set_result(answer)
    except concurrent.futures.InvalidStateError:  # cancelled by the worker meanwhile
        pass
