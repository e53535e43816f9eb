"""The chat screen: sessions sidebar, transcript, composer, resume-cost line and live panel.

It owns the conversation state (the active session, whether a turn runs) and is the only place
that starts engine work: the generation worker (`_generate`, and the model's load) and the
preview worker run `app/generation.py` functions in threads and only post messages back; the
handlers below turn those messages into widget calls. Its parts are objects it owns and builds
with what they use: `TurnView` (`chat_turn.py`: the running turn in the transcript, the panel
and the line under the composer), `Sessions` and `Copying` (`chat_sessions.py`: the active
session, the session and copy actions), `ModelLoader` and `ThinkingChoice` (`chat_model.py`:
loading the model, following its PLE table, the thinking key), `AttachedFiles`
(`chat_files.py`: the chips above the composer, `/read`, `/pin`), `Queue` (`chat_queue.py`:
messages typed while a reply streams, stored as drafts), `Compaction` (`chat_compact.py`:
`/compact`, the fill warning, the continuation and the view marker), `ToolSteps`
(`chat_tools.py`: tool approvals, a turn's tool steps in the transcript, `/undo`). Revisions (`e` / `r` on a
focused message, Ctrl+R) are a `Revision` (`app/revisions.py`) sent as a turn with
`revise_at`: the worker runs it in a fork. Textual's handlers and actions stay on the screen and
call them.
"""

from __future__ import annotations

import threading
from pathlib import Path

from textual import events, on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import Footer, Input, Static
from textual.worker import get_current_worker

from velo_chat.engine.config import Profile
from velo_chat.store import Attachment, Session, StoreError
from velo_chat.store import Message as StoredMessage
from velo_chat.store.input_text import BinaryInput, clean_text

from .. import keymap
from ..attachments import AttachmentLimits, AttachmentRefused
from ..revisions import Revision, last_revision, revision_at
from ..dialogs.confirm import ConfirmDialog
from ..dialogs.message import error_dialog
from ..errors import UserError
from ..gc_hold import FullCollectionHold
from ..generation import TurnRequest, run_apply, run_preview, run_turn, ui_shares_cores
from ..messages import (
    CompactionMade,
    CompactionNotMade,
    CompactionProgressed,
    EngineNotice,
    ModelLoadFailed,
    ModelLoadProgress,
    ModelReady,
    PrefillUpdated,
    PreviewReady,
    TokensStreamed,
    ToolApprovalAsked,
    ToolCallDone,
    ToolStepBegan,
    TurnAccepted,
    TurnBegan,
    TurnEnded,
    TurnMakingRoom,
    TurnRejected,
    TurnWaiting,
)
from ..widgets.composer.chips import AttachmentChips
from ..widgets.composer.composer import Composer
from ..widgets.composer.queue import MessageQueue
from ..widgets.sessions.sidebar import SessionList, SessionSidebar
from ..widgets.telemetry.panel import LivePanel
from ..widgets.transcript.message import MessageView
from ..widgets.transcript.transcript import Transcript
from ..widgets.transcript.message import CodeWidthChanged
from ..widgets.transcript.panes import fit_side_panes, pane_keyed
from .base import VeloScreen
from .chat_model import ModelLoader, ThinkingChoice
from .chat_compact import Compaction, compact_focus
from .chat_files import PIN_COMMAND, READ_COMMAND, AttachedFiles, read_command_paths
from .chat_queue import Queue
from .chat_tools import ToolSteps
from .chat_sessions import Copying, Sessions, header_text
from .chat_turn import TurnView, resume_line

NARROW = 100  # below this many columns the sidebar starts collapsed


class ChatScreen(VeloScreen):
    BINDINGS = keymap.bindings("chat")
    CSS_PATH = "../../assets/styles/chat.tcss"
    AUTO_FOCUS = "#composer"  # from the first key on: typing goes to the message input

    def __init__(self) -> None:
        super().__init__(id="chat")
        self.busy = False
        self._cancel = threading.Event()
        self._gc_hold = FullCollectionHold()  # no full collection while a reply streams
        self._preview_timer: Timer | None = None
        self.turn_view = TurnView(
            transcript=lambda: self.query_one(Transcript),
            panel=lambda: self.query_one(LivePanel),
            show_line=self._show_line,
            notify=self.notify,
            push_screen=self.app.push_screen,
        )
        self.model = ModelLoader(
            self.app,
            post=self.post_message,
            run_worker=self.run_worker,
            set_interval=self.set_interval,
            panel=lambda: self.query_one(LivePanel),
            show_line=self._show_line,
            stop_turn=lambda: self._cancel.set(),
            ready_changed=self._sync_composer,
            request_preview=self.request_preview,
        )
        self.thinking = ThinkingChoice(profile=lambda: self.app.profile, support=lambda: self.model.thinking)
        self.sessions = Sessions(
            self.app,
            notify=self.notify,
            sidebar=lambda: self.query_one(SessionSidebar),
            session_list=lambda: self.query_one(SessionList),
            transcript=lambda: self.query_one(Transcript),
            composer=lambda: self.query_one(Composer),
            busy=lambda: self.busy,
            session_changed=self._update_header,
            request_preview=self.request_preview,
            opened=self._session_opened,
        )
        self.compaction = Compaction(
            self.app,
            post=self.post_message,
            run_worker=self.run_worker,
            sessions=self.sessions,
            transcript=lambda: self.query_one(Transcript),
            panel=lambda: self.query_one(LivePanel),
            composer=lambda: self.query_one(Composer),
            show_line=self._show_line,
            notify=self.notify,
            push_screen=self.app.push_screen,
            session_changed=self._update_header,
        )
        self.files = AttachedFiles(
            chips=lambda: self.query_one(AttachmentChips),
            limits=lambda: AttachmentLimits.from_settings(self.app.profile.attachments),
            base=self.working_dir,
            history=self._history,
            changed=self.request_preview,
        )
        self.queue = Queue(
            lambda: self.app.store,
            widget=lambda: self.query_one(MessageQueue),
            session=lambda: self.session,
            resume_key=self.queue_key,
        )
        self.revising: Revision | None = None  # the message the composer's text will replace
        self.tool_steps = ToolSteps(
            self.app,
            store=lambda: self.app.store,
            transcript=lambda: self.query_one(Transcript),
            panel=lambda: self.query_one(LivePanel),
            turn_view=self.turn_view,
            session=lambda: self.session,
            busy=lambda: self.busy,
            base=self.working_dir,
            give_back=lambda text: self.query_one(Composer).give_back(text),
            run_worker=self.run_worker,
            show_thinking=lambda: self.app.profile.reasoning.show_thinking,
            cursor_blink=self.app.cursor_blink,
        )
        self.copying = Copying(
            transcript=lambda: self.query_one(Transcript),
            focused=lambda: self.focused,
            copy_to_clipboard=self.app.copy_to_clipboard,
            notify=self.notify,
        )

    @property
    def session(self) -> Session | None:
        """The active session (None: a new one, made by its first turn)."""
        return self.sessions.active

    @property
    def model_ready(self) -> bool:
        """A model is loaded: turns can run."""
        return self.model.ready

    def compose(self) -> ComposeResult:
        app = self.app
        with Horizontal(id="chat-body"):
            yield SessionSidebar(clock=app.wall_clock, cursor_blink=app.cursor_blink, id="sidebar")
            with Vertical(id="main"):
                yield Static("", id="session-header")
                yield Transcript(show_thinking=app.profile.reasoning.show_thinking, id="transcript")
                yield MessageQueue(id="queue")
                yield AttachmentChips(id="chips")
                yield Composer(cursor_blink=app.cursor_blink, id="composer")
                yield Static("", id="preview-line")
            yield LivePanel(
                clock=app.clock,
                memory_probe=app.memory_probe,
                memory_interval=app.memory_interval,
                id="panel",
            )
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#sidebar").display = self.app.size.width >= NARROW
        self.query_one("#panel").display = self.app.profile.display.show_live_panel
        self.query_one(LivePanel).set_speculation(self.app.profile.speculation.enabled)
        self.query_one(LivePanel).set_thinking_budget(self.app.profile.reasoning.budget_tokens)
        self.sessions.refresh()
        self._update_header()
        self._session_opened()
        self.app.profile_changed.subscribe(self, self._profile_changed)
        self._sync_composer()
        self.query_one(Composer).focus()
        if self.app.load_on_start:
            self.reload_model(self.app.profile)

    def _sync_composer(self) -> None:
        """Tell the composer whether Enter may send now (else it keeps the text), and show a
        streaming reply on it (`-busy`). The cursors stop blinking while a reply streams: each
        blink is a frame, and on a small machine the UI's frames are taken from the decode
        (`app/stream_pacer.py`); typing still works and the cursor stays visible."""
        composer = self.query_one(Composer)
        composer.accepting = self.model_ready or self.busy  # while a reply streams, Enter queues
        composer.set_class(self.busy, "-busy")
        blink = self.app.cursor_blink and not self.busy
        composer.cursor_blink = blink
        self.query_one("#session-filter", Input).cursor_blink = blink

    # -- sending ------------------------------------------------------------------------------

    @on(Composer.Submitted)
    async def _send(self, event: Composer.Submitted) -> None:
        """Enter: `/read PATH...` attaches (`/pin PATH...` pinned), `/compact [focus]` compacts
        the session; during a reply the message is queued; else it is sent, with the attached
        files, as a revision when one is being written."""
        focus = compact_focus(event.text)
        if focus is not None:
            self._compact(focus, event.text)
            return
        if self.tool_steps.undo_command(event.text):
            return
        try:
            for command, pinned in ((READ_COMMAND, False), (PIN_COMMAND, True)):
                paths = read_command_paths(event.text, command)
                if paths is not None:
                    if not paths:
                        raise AttachmentRefused(
                            f"{command} needs a path (or several; globs such as src/*.py work)"
                        )
                    self._attach_files(paths, given_back=event.text, pinned=pinned)
                    return
            clean = clean_text(event.text, "the message")
        except (BinaryInput, AttachmentRefused) as exc:
            event.composer.give_back(event.text)
            self.app.push_screen(error_dialog("The message was not sent", str(exc)))
            return
        if clean.replaced:
            self.notify(
                f"{clean.replaced} character(s) of the message were not valid text and were sent as \ufffd.",
                severity="warning",
            )
        if self.queue.editing is not None:
            self._say_store_error(self.queue.replace_edited(clean.text, self.files.take()))
            self._send_next_queued()
            return
        if self.busy:
            self._queue(clean.text)
            return
        if not self.model_ready:  # changed since the composer took the text
            event.composer.give_back(event.text)
            self._say_why_not_sent()
            return
        revision, self.revising = self.revising, None
        await self._start_turn(
            clean.text, self.files.take(), revise_at=revision.position if revision else None
        )

    def _queue(self, text: str) -> None:
        if self.revising is not None:
            self.notify(
                "A revision is sent when no reply streams: it was queued as a new message.", timeout=4
            )
            self.revising = None
        self._say_store_error(self.queue.add(text, self.files.take()))
        self.notify(f"Queued ({len(self.queue)} waiting): sent when the reply ends.", timeout=3)

    def _say_store_error(self, error: str | None) -> None:
        if error:
            self.app.push_screen(
                error_dialog(
                    "The queued message is not stored",
                    f"The session store refused it ({error}). It is queued, but a quit would lose it.",
                )
            )

    @on(Composer.Held)
    def _held(self) -> None:
        self._say_why_not_sent()

    def _say_why_not_sent(self) -> None:
        self.notify(
            "The model is not loaded yet. Your message stays in the input; press "
            "Enter again when it is ready.",
            severity="warning",
        )

    # -- revisions: any earlier message, in a fork ----------------------------------------------

    def _focused_message(self) -> tuple[MessageView, int] | None:
        """The focused message and its position in the session (None: none focused, or not
        stored yet)."""
        view = self.focused
        if not isinstance(view, MessageView) or view.message_id is None or self.session is None:
            return None
        try:
            return view, self.app.store.get_message(view.message_id).position
        except StoreError as exc:
            self.app.push_screen(error_dialog("Cannot read the message", str(exc)))
            return None

    def action_revise_message(self) -> None:
        """Put the focused message of the user's (and its files) in the composer: sending it
        makes a fork holding the conversation before it plus the revision."""
        found = self._focused_message()
        if found is None or found[0].role != "user":
            self.notify("Focus one of your messages to revise it.", severity="warning")
            return
        messages = self._history()
        try:
            revision = revision_at(messages, found[1], regenerate=False)
        except UserError as exc:
            self.notify(str(exc), severity="warning")
            return
        self.revising = revision
        composer = self.query_one(Composer)
        composer.load_text(revision.text)
        composer.move_cursor(composer.document.end)
        self.files.restore(revision.attachments)
        composer.focus()
        self._show_line(self._revise_line())
        self.request_preview()
        self.tool_steps.offer_undo_before(revision.position)

    def _revise_line(self) -> str:
        assert self.revising is not None
        turn = sum(1 for m in self._history() if m.role == "user" and m.position <= self.revising.position)
        return (
            f"[b]revising your message {turn}[/b]: Enter sends it in a fork (this session stays)"
            " · Esc cancels"
        )

    async def action_regenerate_message(self) -> None:
        """Answer the focused reply again, in a fork (the session keeps this answer)."""
        found = self._focused_message()
        if found is None or found[0].role != "assistant":
            self.notify("Focus a reply to answer it again.", severity="warning")
            return
        try:
            revision = revision_at(self._history(), found[1], regenerate=True)
        except UserError as exc:
            self.notify(str(exc), severity="warning")
            return
        await self._regenerate(revision)

    async def action_regenerate(self) -> None:
        """Answer the last question again, in a fork."""
        if self.session is None:
            self.notify("Nothing to regenerate now.", severity="warning")
            return
        try:
            revision = last_revision(self._history())
        except UserError as exc:
            self.notify(str(exc), severity="warning")
            return
        await self._regenerate(revision)

    async def _regenerate(self, revision: Revision) -> None:
        if self.busy or not self.model_ready:
            self.notify(
                "Nothing can be answered again while a reply streams or the model loads.", severity="warning"
            )
            return
        await self._start_turn(
            revision.text, revision.attachments, revise_at=revision.position, regenerate=True
        )

    def _history(self) -> list[StoredMessage]:
        """The active session's stored messages ([] for a new session, or when unreadable)."""
        if self.session is None:
            return []
        try:
            return self.app.store.messages(self.session.id)
        except StoreError:
            return []

    def working_dir(self) -> Path:
        """The folder attached paths start from: the session's, where it still exists, else the
        folder velo-chat was started in."""
        stored = self.session.working_dir if self.session else None
        if stored and Path(stored).is_dir():
            return Path(stored)
        return Path.cwd()

    async def _start_turn(
        self,
        text: str,
        attachments: tuple[Attachment, ...] = (),
        *,
        revise_at: int | None = None,
        regenerate: bool = False,
    ) -> None:
        self._begin_busy()
        if revise_at is not None:  # the fork's view: the messages before the revised one
            await self.query_one(Transcript).show_messages(
                [m for m in self._history() if m.position < revise_at]
            )
        await self.turn_view.begin(
            text, attachments=attachments, show_thinking=self.app.profile.reasoning.show_thinking
        )
        request = TurnRequest(
            text,
            self.session,
            self.app.profile,
            attachments=attachments,
            revise_at=revise_at,
            regenerate=regenerate,
            working_dir=str(Path.cwd()),
            reasoning=self.thinking.reasoning(),
            paced=self.app.pace_stream,
            # a revision runs in a fork: a new session, with approvals of its own
            tool_policy=self.tool_steps.policy(
                self.session if revise_at is None else None, self.app.profile.tools
            ),
        )
        # Where the decode leaves the UI no core, the engine starts once the new messages are
        # laid out and drawn: after a short prefill that frame would otherwise be drawn over the
        # decode's first tokens, taking their threads' time (docs/threads.md, "The TUI's own
        # thread beside the decode"). Where it leaves the UI a core of its own
        # (`stream_pacer.ui_has_own_core`), the frame and the prefill run side by side.
        if self.model.info is not None and ui_shares_cores(self.model.info):
            self.call_after_refresh(self._generate, request)
        else:
            self._generate(request)

    @work(thread=True, exclusive=True, group="generation")
    def _generate(self, request: TurnRequest) -> None:
        worker = get_current_worker()
        run_turn(
            self.app.host,
            self.app.store,
            request,
            self.post_message,
            self._cancel,
            lambda: worker.is_cancelled,
        )

    def _begin_busy(self) -> None:
        """A turn or a compaction starts: Enter queues, Esc stops it (`_cancel`)."""
        self.busy = True
        self._sync_composer()
        self._gc_hold.hold()
        self._cancel = threading.Event()

    # -- compaction: `/compact`, a turn that made room first (chat_compact.py) ------------------

    def _compact(self, focus: str, text: str) -> None:
        """`/compact [focus]`: summarize the session into a continuation (the typed command goes
        back when it cannot start, or when nothing is made)."""
        session = self.session
        if session is None or self.busy or not self.model_ready:
            self.query_one(Composer).give_back(text)
            self.notify(self.compaction.refusal(session, ready=self.model_ready), severity="warning")
            return
        self.revising = None  # "/compact" took the revision's place in the composer
        self._begin_busy()
        reasoning = self.thinking.reasoning()
        self.compaction.start(session, focus, text=text, cancel=self._cancel, reasoning=reasoning)

    def on_compaction_progressed(self, msg: CompactionProgressed) -> None:
        self.compaction.progress(msg)

    async def on_compaction_made(self, msg: CompactionMade) -> None:
        self._end_busy()
        await self.compaction.made(msg)
        if not self._send_next_queued():
            self.request_preview()

    def on_compaction_not_made(self, msg: CompactionNotMade) -> None:
        self._end_busy()
        self.compaction.not_made(msg)
        if len(self.queue):
            self.queue.pause()
        self.request_preview()

    def on_turn_making_room(self, msg: TurnMakingRoom) -> None:
        self.compaction.making_room(msg.line)

    async def on_turn_rejected(self, msg: TurnRejected) -> None:
        await self.turn_view.remove()
        self._end_busy()
        if self.session is not None:  # a rejected revision showed the fork's view: the session's
            await self.query_one(Transcript).show_messages(self._history())
            await self.compaction.show_view_start(self.session)
        if msg.give_back:  # a regenerate's question is still stored: nothing to give back
            self.query_one(Composer).give_back(msg.text)
            self.files.restore(msg.attachments)
        if len(self.queue):
            self.queue.pause()
        self.app.push_screen(error_dialog("The message was not sent", msg.reason))

    def on_turn_waiting(self, msg: TurnWaiting) -> None:
        self._show_line(
            f"[b]waiting[/b]: {msg.holder} is taking a turn in this session; yours starts when it ends"
            " · Esc stops"
        )

    async def on_turn_accepted(self, msg: TurnAccepted) -> None:
        if not msg.created:  # another process may have added messages since they were shown
            await self._show_messages_added_elsewhere(msg)
        self.sessions.active = msg.session
        self.turn_view.accepted(msg)
        await self.compaction.accepted(msg, self.turn_view.user)
        self.queue.session_ready(msg.session)
        self.sessions.refresh()
        self._update_header()
        if msg.forked_from is not None:
            self.notify(
                f"The revision is in a fork; “{msg.forked_from.title or 'untitled'}” stays as it was.",
                timeout=5,
            )

    async def _show_messages_added_elsewhere(self, msg: TurnAccepted) -> None:
        transcript = self.query_one(Transcript)
        shown = {view.message_id for view in transcript.views()}
        missed = [
            m
            for m in self.app.store.messages(msg.session.id)
            if m.position < msg.user.position and m.id not in shown
        ]
        if missed and self.turn_view.user is not None:
            await transcript.insert_before(self.turn_view.user, missed)
            self.notify(
                f"{len(missed)} message(s) were added to this session by another velo-chat.", timeout=5
            )

    def on_turn_began(self, msg: TurnBegan) -> None:
        self.turn_view.began(msg)

    def on_prefill_updated(self, msg: PrefillUpdated) -> None:
        self.turn_view.prefill(msg)

    async def on_tokens_streamed(self, msg: TokensStreamed) -> None:
        await self.turn_view.tokens(msg)

    def on_engine_notice(self, msg: EngineNotice) -> None:
        self.notify(msg.message, severity="warning")

    async def on_tool_approval_asked(self, msg: ToolApprovalAsked) -> None:
        await self.tool_steps.approval_asked(msg)

    async def on_tool_step_began(self, msg: ToolStepBegan) -> None:
        await self.tool_steps.step_began(msg)

    async def on_tool_call_done(self, msg: ToolCallDone) -> None:
        await self.tool_steps.call_done(msg)

    async def on_turn_ended(self, msg: TurnEnded) -> None:
        await self.tool_steps.turn_ended()
        await self.turn_view.ended(msg)
        self._end_busy()
        self.turn_view.tell(msg)
        self.compaction.turn_ended(msg.stats, self.session)
        self.sessions.refresh()
        stopped = msg.stats is not None and msg.stats.finish_reason in ("cancelled", "interrupted")
        if len(self.queue) and (msg.failed or stopped or not msg.saved):
            self.queue.pause()
            self.notify(
                f"The queue is paused ({len(self.queue)} waiting): {self.queue_key()} sends the next.",
                severity="warning",
                timeout=6,
            )
        if not self._send_next_queued():
            self.request_preview()

    def _send_next_queued(self) -> bool:
        """Send the next queued message if no reply streams; whether one was sent."""
        if self.busy or not self.model_ready:
            return False
        item = self.queue.next()
        if item is None:
            return False
        self.run_worker(self._start_turn(item.text, item.attachments), group="queue")
        return True

    def queue_key(self) -> str:
        return keymap.key_label(
            keymap.effective_key(keymap.BY_ID["chat.send_queue"], self.app.settings.keymap)
        )

    def action_send_queue(self) -> None:
        if not len(self.queue):
            self.notify("No message is queued.", timeout=3)
            return
        self.queue.resume()
        if self.busy:
            self.notify("The queue goes on when this reply ends.", timeout=3)
        elif not self._send_next_queued():
            self.notify(
                "The queued message being edited goes first: send it (Enter) or remove it.", timeout=5
            )

    @on(MessageQueue.EditRequested)
    def _edit_queued(self, event: MessageQueue.EditRequested) -> None:
        item = self.queue.edit(event.key)
        if item is None:
            return
        composer = self.query_one(Composer)
        composer.give_back(item.text)
        self.files.restore(item.attachments)
        composer.focus()
        self._show_line("[b]editing a queued message[/b]: Enter puts it back in its place")

    @on(MessageQueue.RemoveRequested)
    def _remove_queued(self, event: MessageQueue.RemoveRequested) -> None:
        self.queue.remove(event.key)

    def _session_opened(self) -> None:
        """A session was opened (or the new one): its folder for `@`, its queued messages."""
        self.revising = None
        self.query_one(Composer).set_file_root(self.working_dir())
        self.call_later(self.compaction.show_view_start, self.session)
        waiting = self.queue.load(self.session)
        if waiting:
            self.app.push_screen(
                ConfirmDialog(
                    "Send the queued messages?",
                    f"{waiting} message(s) were queued in this session and not sent. Send them now, in "
                    f"order? (Or keep them queued: {self.queue_key()} sends them later; each can be "
                    "edited or removed in the queue.)",
                    yes="Send",
                    no="Keep queued",
                ),
                self._queued_choice,
            )

    def _queued_choice(self, send: bool | None) -> None:
        if send:
            self.action_send_queue()

    # -- attaching files -----------------------------------------------------------------------

    def _attach_files(self, paths: list[str], *, given_back: str = "", pinned: bool = False) -> None:
        """Attach files (a dialog when refused, and the text that asked is given back)."""
        try:
            warnings = self.files.attach(paths, pinned=pinned)
        except AttachmentRefused as exc:
            if given_back:
                self.query_one(Composer).give_back(given_back)
            self.app.push_screen(error_dialog("The file was not attached", str(exc)))
            return
        for line in warnings:
            self.notify(line, severity="warning")

    @on(Composer.FilesChosen)
    def _files_chosen(self, event: Composer.FilesChosen) -> None:
        self._attach_files(list(event.paths))

    @on(AttachmentChips.Removed)
    def _chip_removed(self, event: AttachmentChips.Removed) -> None:
        self.files.remove(event.index)
        self.query_one(Composer).focus()

    def _end_busy(self) -> None:
        self.turn_view.end()
        self.busy = False
        self._sync_composer()
        self._gc_hold.release()

    def on_unmount(self) -> None:
        self.tool_steps.close()
        self.stop_engine_work()
        self._gc_hold.release()

    def stop_engine_work(self) -> None:
        """The app is closing: stop a running turn or load so the engine can be closed."""
        self._cancel.set()
        self.model.stop()

    def action_cancel_turn(self) -> None:
        if self.busy and not self._cancel.is_set():
            self._cancel.set()
            if len(self.queue):
                self.queue.pause()
                self.notify(
                    f"Stopping the reply; the queue is paused ({len(self.queue)} waiting, "
                    f"{self.queue_key()} sends the next).",
                    timeout=5,
                )
            else:
                what = "compaction" if self.compaction.running else "reply"
                self.notify(f"Stopping the {what}…", timeout=2)
        elif self.revising is not None:
            self.revising = None
            self._show_line("")
            self.notify("Not revising any more: Enter sends the text as a new message.", timeout=3)
            self.request_preview()
        elif self.queue.editing is not None:
            self.queue.stop_editing()
            self._show_line("")

    # -- the model, the sessions, copying: Textual's side, calling the parts -------------------

    def reload_model(self, profile: Profile, *, activate: bool = False, force: bool = False) -> None:
        """Load (or reload) the engine for `profile` in the background (`ModelLoader.reload`)."""
        self.model.reload(profile, activate=activate, force=force)

    def on_model_load_progress(self, msg: ModelLoadProgress) -> None:
        self.model.progress(msg)

    def on_model_ready(self, msg: ModelReady) -> None:
        self.model.loaded(msg)

    def on_model_load_failed(self, msg: ModelLoadFailed) -> None:
        self.model.failed(msg)

    def on_session_sidebar_filter_changed(self, event: SessionSidebar.FilterChanged) -> None:
        self.sessions.filter(event.query)

    async def on_session_sidebar_selected(self, event: SessionSidebar.Selected) -> None:
        await self.open_session(event.session_id)

    async def open_session(self, session_id: str | None) -> None:
        await self.sessions.open(session_id)

    async def action_new_session(self) -> None:
        await self.sessions.open(None)

    def action_rename_session(self) -> None:
        self.sessions.rename()

    def action_delete_session(self) -> None:
        self.sessions.delete()

    async def action_fork_session(self) -> None:
        await self.sessions.fork()

    def action_export_session(self) -> None:
        self.sessions.export()

    def action_switch_profile(self) -> None:
        self.sessions.switch_profile()

    def action_copy_message(self) -> None:
        self.copying.message()

    def action_copy_code(self) -> None:
        self.copying.code()

    # -- resume-cost preview ------------------------------------------------------------------

    @on(Composer.Changed)
    def _draft_changed(self) -> None:
        if self._preview_timer is not None:
            self._preview_timer.stop()
        self._preview_timer = self.set_timer(0.4, self.request_preview)

    def request_preview(self) -> None:
        if not self.model_ready or self.busy:
            return
        draft = self.query_one(Composer).text or " "
        self._preview(
            TurnRequest(
                draft,
                self.session,
                self.app.profile,
                attachments=tuple(self.files.files),
                revise_at=self.revising.position if self.revising else None,
                reasoning=self.thinking.reasoning(),
            )
        )

    @work(thread=True, exclusive=True, group="preview")
    def _preview(self, request: TurnRequest) -> None:
        run_preview(self.app.host, self.app.store, request, self.post_message)

    def on_preview_ready(self, msg: PreviewReady) -> None:
        self.files.counted(self.files.files, msg.file_tokens)
        if not self.busy:
            line = resume_line(
                msg.preview, self.thinking.thinks(), self.files.tokens(), len(self.files.files)
            )
            if msg.preview is not None and self.model.info is not None and not self.revising:
                full = self.compaction.preview_warning(msg.preview, self.model.info.n_ctx, self.session)
                line = f"{full} · {line}" if full else line
            self._show_line(f"{self._revise_line()} · {line}" if self.revising else line)

    # -- thinking -----------------------------------------------------------------------------

    def action_toggle_thinking(self) -> None:
        """Turn thinking on or off for the next turns (not saved in the profile)."""
        thinks = self.thinking.toggle()
        if thinks is None:
            self.notify("This model's chat template has no thinking switch.", severity="warning")
            return
        self.notify(f"Thinking {'on' if thinks else 'off'} from the next turn.", timeout=3)
        self.request_preview()

    # -- layout -------------------------------------------------------------------------------

    def _profile_changed(self, profile: Profile) -> None:
        """A saved or switched profile takes effect at once: display settings here, the
        engine's per-turn and checkpoint settings in the engine (`run_apply`)."""
        self.query_one("#panel").display = profile.display.show_live_panel
        self.query_one(LivePanel).set_speculation(profile.speculation.enabled)
        self.query_one(LivePanel).set_thinking_budget(profile.reasoning.budget_tokens)
        self.query_one(Transcript).set_show_thinking(profile.reasoning.show_thinking)
        self._apply(profile)
        self._update_header()
        self.request_preview()  # e.g. `reasoning.enabled` changed: the line says it

    @work(thread=True, group="apply")
    def _apply(self, profile: Profile) -> None:
        run_apply(self.app.host, profile)

    def _update_header(self) -> None:
        self.query_one("#session-header", Static).update(header_text(self.session, self.app.profile.name))

    def _show_line(self, text: str) -> None:
        """The line under the composer: the resume cost, prefill progress, or a state."""
        self.query_one("#preview-line", Static).update(text)

    def action_toggle_sidebar(self) -> None:
        bar = self.query_one("#sidebar")
        bar.display = not bar.display
        pane_keyed(bar)

    def action_toggle_panel(self) -> None:
        panel = self.query_one("#panel")
        panel.display = not panel.display
        pane_keyed(panel)

    def on_resize(self, event: events.Resize) -> None:
        """Panes that gave way to code come back where the window now has room for them."""
        self._fit_panes_to_code(resized=True)

    @on(CodeWidthChanged)
    def _fit_panes_to_code(self, _: CodeWidthChanged | None = None, *, resized: bool = False) -> None:
        """The live panel, then the sidebar, give way while the transcript is too narrow for its
        widest code line (`panes.py`); the user is told when they go."""
        panes = [self.query_one("#panel"), self.query_one("#sidebar")]
        if fit_side_panes(panes, self.query_one(Transcript), self.app.size.width, resized=resized):
            self.notify("Side panes hidden to fit code; Ctrl+B / Ctrl+T bring them back.", timeout=6)

    def action_focus_input(self) -> None:
        self.query_one(Composer).focus()

    def action_focus_filter(self) -> None:
        self.query_one("#sidebar").display = True
        self.query_one("#session-filter").focus()
