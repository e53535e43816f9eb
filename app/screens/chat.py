"""The chat screen: sessions sidebar, transcript, composer, resume-cost line and live panel.

It owns the conversation state (the active session, whether a turn runs) and is the only place
that starts engine work: the generation worker (`_generate`, `_load`) and the preview worker run
`app/generation.py` functions in threads and only post messages back; the
handlers below turn those messages into widget calls. Session actions live in `chat_sessions.py`,
loading the model (and following its PLE table) in `chat_model.py`.
"""

from __future__ import annotations

import dataclasses
import threading

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input, Static
from textual.worker import get_current_worker

from velo_chat.engine.events import ModelLoaded
from velo_chat.engine.config.profile_schema import Profile, ReasoningSettings
from velo_chat.engine.prompt.thinking import ThinkingSupport, requested
from velo_chat.store import Session
from velo_chat.store.input_text import BinaryInput, clean_text

from .. import keymap
from ..dialogs.message import error_dialog
from ..gc_hold import FullCollectionHold
from ..load_rate import LoadRate
from ..generation import TurnRequest, run_apply, run_preview, run_turn, ui_shares_cores
from ..messages import (
    EngineNotice,
    PrefillUpdated,
    PreviewReady,
    TokensStreamed,
    TurnAccepted,
    TurnBegan,
    TurnEnded,
    TurnRejected,
)
from ..widgets.composer.composer import Composer
from ..widgets.sessions.sidebar import SessionSidebar
from ..widgets.telemetry.panel import LivePanel
from ..widgets.transcript.message import MessageView
from ..widgets.transcript.transcript import Transcript
from .chat_model import ModelLoading
from .chat_sessions import SessionActions

NARROW = 100  # below this many columns the sidebar starts collapsed


class ChatScreen(ModelLoading, SessionActions, Screen[None]):
    BINDINGS = keymap.bindings("chat")
    CSS_PATH = "../../assets/styles/chat.tcss"
    AUTO_FOCUS = "#composer"  # from the first key on: typing goes to the message input

    def __init__(self) -> None:
        super().__init__(id="chat")
        self.session: Session | None = None
        self.busy = False
        self.model_ready = False
        self._cancel = threading.Event()
        self._line_says_prefill = False  # the line under the composer shows prefill progress
        self._load_cancel = threading.Event()
        self._load_id = 0  # messages of an older load are stale and ignored
        self._activate_on_ready = False  # make the loading profile the saved active one
        self._model_info: ModelLoaded | None = None  # what the running engine reported
        self._loading_name = ""
        self._load_rate = LoadRate(None)  # bytes/s and time left of the load in progress
        self._ple_timer: Timer | None = None  # polls the PLE table's page-cache residency
        self._reply: MessageView | None = None
        self._gc_hold = FullCollectionHold()  # no full collection while a reply streams
        self._user_view: MessageView | None = None
        self._preview_timer: Timer | None = None
        self._thinking_support: ThinkingSupport | None = None  # the running model's template
        # The thinking key's choice (on/off), with the profile's `reasoning.enabled` when it was
        # pressed: a profile saved with another value since then wins.
        self._thinking: tuple[str, bool] | None = None

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
        self.refresh_sessions()
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
        transcript = self.query_one(Transcript)
        transcript.freeze_history()  # before the new messages: they count only once laid out
        self._user_view = await transcript.add_message(MessageView("user", text))
        self._reply = await transcript.add_message(
            MessageView("assistant", streaming=True, show_thinking=self.app.profile.reasoning.show_thinking)
        )
        transcript.scroll_end(animate=False)
        transcript.follow()
        self.query_one(LivePanel).turn_sent()
        self.query_one("#preview-line", Static).update("[i]thinking… Esc stops[/i]")
        self._line_says_prefill = False
        request = TurnRequest(
            text,
            self.session,
            self.app.profile,
            self.app.turn_kwargs,
            rewind=rewind,
            reasoning=self._reasoning(),
            paced=self.app.pace_stream,
        )
        # Where the decode leaves the UI no core, the engine starts once the new messages are
        # laid out and drawn: after a short prefill that frame would otherwise be drawn over the
        # decode's first tokens, taking their threads' time (benchmarks/README.md, the TUI
        # section). With a core to spare, the frame and the prefill run side by side.
        if self._model_info is not None and ui_shares_cores(self._model_info):
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
        for view in (self._user_view, self._reply):
            if view is not None:
                await view.remove()
        self._end_busy()
        if self.session is not None:  # a rejected regenerate removed views: show the store's
            await self.query_one(Transcript).show_messages(self.app.store.messages(self.session.id))
        if not msg.rewind:  # a regenerate's question is still stored: nothing to give back
            self.query_one(Composer).give_back(msg.text)
        self.app.push_screen(error_dialog("The message was not sent", msg.reason))

    def on_turn_accepted(self, msg: TurnAccepted) -> None:
        self.session = msg.session
        if self._reply is not None:
            self._reply.message_id = msg.reply.id
        if self._user_view is not None:
            self._user_view.message_id = msg.user.id
        self.refresh_sessions()
        self._update_header()

    def on_turn_began(self, msg: TurnBegan) -> None:
        self.query_one(LivePanel).turn_began(msg.started, msg.n_ctx)

    def on_prefill_updated(self, msg: PrefillUpdated) -> None:
        self.query_one(LivePanel).prefill(msg.progress)
        p = msg.progress
        self.query_one("#preview-line", Static).update(
            f"prefilling {p.done:,}/{p.total:,} · ETA {p.eta_s:.1f} s · Esc stops"
        )
        self._line_says_prefill = True

    async def on_tokens_streamed(self, msg: TokensStreamed) -> None:
        if self._line_says_prefill:  # the prefill is over: its progress would read stale
            self._line_says_prefill = False
            self.query_one("#preview-line", Static).update("[i]replying… Esc stops[/i]")
        if self._reply is not None:
            self.query_one(Transcript).freeze_history()  # what the reply pushed up since
            await self._reply.stream_text(msg.text, msg.reasoning)
        self.query_one(LivePanel).tokens(
            msg.n_tokens,
            msg.t_first,
            msg.t_last,
            n_reasoning=msg.n_reasoning,
            answering=bool(msg.text),
            samples=msg.samples,
        )

    def on_engine_notice(self, msg: EngineNotice) -> None:
        self.notify(msg.message, severity="warning")

    async def on_turn_ended(self, msg: TurnEnded) -> None:
        if self._reply is not None:
            reply = msg.reply
            # What streamed on screen wins over the stored row, which may lag a flush behind
            # or not have been written at all.
            text = msg.text if msg.text is not None else (reply.content if reply else self._reply.text)
            reasoning = (
                msg.reasoning
                if msg.text is not None
                else (reply.reasoning if reply else self._reply.reasoning)
            )
            status = "error" if msg.failed else (reply.status if reply else "interrupted")
            await self._reply.finish(text, status, reply.id if reply else None, reasoning)
        self.query_one(LivePanel).turn_ended(msg.stats)
        self._end_busy()
        if msg.failed:
            self.notify(f"The reply failed: {msg.failed}", severity="error", timeout=8)
        if not msg.saved:
            self.app.push_screen(
                error_dialog(
                    "The reply was not saved",
                    f"The session store refused it ({msg.save_error}). "
                    "The reply is shown here but will not be in the session after a restart: "
                    "copy what you need.",
                )
            )
        elif msg.stats is not None and msg.stats.finish_reason == "context":
            self.notify(
                "The reply stopped at the end of the context window. Start a new "
                "session (Ctrl+N) or raise context.n_ctx in the profile.",
                severity="warning",
                timeout=10,
            )
        self.refresh_sessions()
        self.request_preview()

    def _end_busy(self) -> None:
        self.query_one(Transcript).thaw()
        self.busy = False
        self._sync_composer()
        self._gc_hold.release()
        self._reply = self._user_view = None
        self.query_one("#preview-line", Static).update("")

    def on_unmount(self) -> None:
        self.stop_engine_work()
        self._gc_hold.release()

    def stop_engine_work(self) -> None:
        """The app is closing: stop a running turn or load so the engine can be closed."""
        self._cancel.set()
        self._load_cancel.set()

    def action_cancel_turn(self) -> None:
        if self.busy and not self._cancel.is_set():
            self._cancel.set()
            self.notify("Stopping the reply…", timeout=2)

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
        self._preview(TurnRequest(draft, self.session, self.app.profile, reasoning=self._reasoning()))

    @work(thread=True, exclusive=True, group="preview")
    def _preview(self, request: TurnRequest) -> None:
        run_preview(self.app.host, self.app.store, request, self.post_message)

    def on_preview_ready(self, msg: PreviewReady) -> None:
        if self.busy:
            return
        p = msg.preview
        line = ""
        if p is not None:
            est = f" ≈ {p.est_prefill_s:.1f} s" if p.est_prefill_s is not None else ""
            line = f"reuses {p.cached_tokens:,} cached tokens · prefills {p.prefill_tokens:,}{est}"
            if p.source == "server":
                line = "remote: the server keeps its own prompt cache"
        thinks = self._thinks()
        if thinks is not None:
            line = f"thinking {'on' if thinks else 'off'}" + (f" · {line}" if line else "")
        self.query_one("#preview-line", Static).update(line)

    # -- thinking -----------------------------------------------------------------------------

    def _reasoning(self) -> ReasoningSettings:
        """The reasoning settings the next turn runs with: the profile's, with the thinking
        key's choice while the profile's `reasoning.enabled` is still what it was then."""
        settings = self.app.profile.reasoning
        if self._thinking is not None and self._thinking[0] == settings.enabled:
            return dataclasses.replace(settings, enabled="on" if self._thinking[1] else "off")
        return settings

    def _thinks(self) -> bool | None:
        """Whether the next turn thinks (None: the model's template has no thinking switch)."""
        support = self._thinking_support
        if support is None or not support.can_switch:
            return None
        return support.is_on(requested(self._reasoning())[0])

    def action_toggle_thinking(self) -> None:
        """Turn thinking on or off for the next turns (not saved in the profile)."""
        thinks = self._thinks()
        if thinks is None:
            self.notify("This model's chat template has no thinking switch.", severity="warning")
            return
        self._thinking = (self.app.profile.reasoning.enabled, not thinks)
        self.notify(f"Thinking {'off' if thinks else 'on'} from the next turn.", timeout=3)
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
        profile = self.app.profile.name
        if self.session is None:
            text = f"[b]new session[/b] · profile {profile}"
        else:
            text = f"[b]{(self.session.title or 'untitled').replace('[', chr(92) + '[')}[/b]"
            if self.session.profile != profile:
                text += (
                    f" · [b $warning]session profile {self.session.profile}, running "
                    f"{profile}[/] (Ctrl+O switches)"
                )
            else:
                text += f" · profile {profile}"
        self.query_one("#session-header", Static).update(text)

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
