"""The chat screen: sessions sidebar, transcript, composer, resume-cost line and live panel.

It owns the conversation state (the active session, whether a turn runs) and is the only place
that starts engine work: the generation worker (`_generate`, and the model's load) and the
preview worker run `app/generation.py` functions in threads and only post messages back; the
handlers below turn those messages into widget calls. Its parts are objects it owns and builds
with what they use: `TurnView` (`chat_turn.py`: the running turn in the transcript, the panel
and the line under the composer), `Sessions` and `Copying` (`chat_sessions.py`: the active
session, the session and copy actions), `ModelLoader` and `ThinkingChoice` (`chat_model.py`:
loading the model, following its PLE table, the thinking key). Textual's handlers and actions
stay on the screen and call them.
"""

from __future__ import annotations

import threading

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import Footer, Input, Static
from textual.worker import get_current_worker

from velo_chat.engine.config import Profile
from velo_chat.store import Session
from velo_chat.store.input_text import BinaryInput, clean_text

from .. import keymap
from ..dialogs.message import error_dialog
from ..gc_hold import FullCollectionHold
from ..generation import TurnRequest, run_apply, run_preview, run_turn, ui_shares_cores
from ..messages import (
    EngineNotice,
    ModelLoadFailed,
    ModelLoadProgress,
    ModelReady,
    PrefillUpdated,
    PreviewReady,
    TokensStreamed,
    TurnAccepted,
    TurnBegan,
    TurnEnded,
    TurnRejected,
)
from ..widgets.composer.composer import Composer
from ..widgets.sessions.sidebar import SessionList, SessionSidebar
from ..widgets.telemetry.panel import LivePanel
from ..widgets.transcript.transcript import Transcript
from .base import VeloScreen
from .chat_model import ModelLoader, ThinkingChoice
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
        self.sessions.refresh()
        self._update_header()
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
        composer.accepting = self.model_ready and not self.busy
        composer.set_class(self.busy, "-busy")
        blink = self.app.cursor_blink and not self.busy
        composer.cursor_blink = blink
        self.query_one("#session-filter", Input).cursor_blink = blink

    # -- sending ------------------------------------------------------------------------------

    @on(Composer.Submitted)
    async def _send(self, event: Composer.Submitted) -> None:
        if self.busy or not self.model_ready:  # changed since the composer took the text
            event.composer.give_back(event.text)
            self._say_why_not_sent()
            return
        try:
            clean = clean_text(event.text, "the message")
        except BinaryInput as exc:
            event.composer.give_back(event.text)
            self.app.push_screen(error_dialog("The message was not sent", str(exc)))
            return
        if clean.replaced:
            self.notify(
                f"{clean.replaced} character(s) of the message were not valid text and were sent as \ufffd.",
                severity="warning",
            )
        await self._start_turn(clean.text)

    @on(Composer.Held)
    def _held(self) -> None:
        self._say_why_not_sent()

    def _say_why_not_sent(self) -> None:
        if self.busy:
            self.notify(
                "A reply is streaming: wait, or press Esc to stop it. Your message stays in the input.",
                severity="warning",
            )
        else:
            self.notify(
                "The model is not loaded yet. Your message stays in the input; press "
                "Enter again when it is ready.",
                severity="warning",
            )

    async def action_regenerate(self) -> None:
        """Answer the last question again; resumes from the checkpoint before it."""
        if self.busy or not self.model_ready or self.session is None:
            self.notify("Nothing to regenerate now.", severity="warning")
            return
        transcript = self.query_one(Transcript)
        views = transcript.views()
        users = [i for i, v in enumerate(views) if v.role == "user"]
        if not users:
            self.notify("This session has no question to answer again.", severity="warning")
            return
        text = views[users[-1]].text
        for view in views[users[-1] :]:
            await view.remove()
        await self._start_turn(text, rewind=True)

    async def _start_turn(self, text: str, *, rewind: bool = False) -> None:
        self.busy = True
        self._sync_composer()
        self._gc_hold.hold()
        self._cancel = threading.Event()
        await self.turn_view.begin(text, show_thinking=self.app.profile.reasoning.show_thinking)
        request = TurnRequest(
            text,
            self.session,
            self.app.profile,
            rewind=rewind,
            reasoning=self.thinking.reasoning(),
            paced=self.app.pace_stream,
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

    async def on_turn_rejected(self, msg: TurnRejected) -> None:
        await self.turn_view.remove()
        self._end_busy()
        if self.session is not None:  # a rejected regenerate removed views: show the store's
            await self.query_one(Transcript).show_messages(self.app.store.messages(self.session.id))
        if not msg.rewind:  # a regenerate's question is still stored: nothing to give back
            self.query_one(Composer).give_back(msg.text)
        self.app.push_screen(error_dialog("The message was not sent", msg.reason))

    def on_turn_accepted(self, msg: TurnAccepted) -> None:
        self.sessions.active = msg.session
        self.turn_view.accepted(msg)
        self.sessions.refresh()
        self._update_header()

    def on_turn_began(self, msg: TurnBegan) -> None:
        self.turn_view.began(msg)

    def on_prefill_updated(self, msg: PrefillUpdated) -> None:
        self.turn_view.prefill(msg)

    async def on_tokens_streamed(self, msg: TokensStreamed) -> None:
        await self.turn_view.tokens(msg)

    def on_engine_notice(self, msg: EngineNotice) -> None:
        self.notify(msg.message, severity="warning")

    async def on_turn_ended(self, msg: TurnEnded) -> None:
        await self.turn_view.ended(msg)
        self._end_busy()
        self.turn_view.tell(msg)
        self.sessions.refresh()
        self.request_preview()

    def _end_busy(self) -> None:
        self.turn_view.end()
        self.busy = False
        self._sync_composer()
        self._gc_hold.release()

    def on_unmount(self) -> None:
        self.stop_engine_work()
        self._gc_hold.release()

    def stop_engine_work(self) -> None:
        """The app is closing: stop a running turn or load so the engine can be closed."""
        self._cancel.set()
        self.model.stop()

    def action_cancel_turn(self) -> None:
        if self.busy and not self._cancel.is_set():
            self._cancel.set()
            self.notify("Stopping the reply…", timeout=2)

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
        self._preview(TurnRequest(draft, self.session, self.app.profile, reasoning=self.thinking.reasoning()))

    @work(thread=True, exclusive=True, group="preview")
    def _preview(self, request: TurnRequest) -> None:
        run_preview(self.app.host, self.app.store, request, self.post_message)

    def on_preview_ready(self, msg: PreviewReady) -> None:
        if not self.busy:
            self._show_line(resume_line(msg.preview, self.thinking.thinks()))

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

    def action_toggle_panel(self) -> None:
        panel = self.query_one("#panel")
        panel.display = not panel.display

    def action_focus_input(self) -> None:
        self.query_one(Composer).focus()

    def action_focus_filter(self) -> None:
        self.query_one("#sidebar").display = True
        self.query_one("#session-filter").focus()
