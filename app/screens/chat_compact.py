"""The chat screen's side of a full context (docs/compaction.md): `/compact [focus]`, the line
under the composer when the next turn will fill the context, the turns left in the live panel,
the continuation shown when a turn compacted the session first, and the marker where the model's
view begins once the oldest turns left it.

`ChatScreen` owns one `Compaction` and its handlers call it; what it uses is given to it: the
app, the screen's `post` and `run_worker` (the summary runs in the screen's "generation" worker
group, so it and a turn never run at once), the widgets it writes to, and callbacks into the
screen. The screen keeps what is the conversation's: whether it is busy, the cancel event, the
queue. Nothing here talks to the engine: `app/generation_compaction.py`'s `run_compaction` does, in a
thread, and posts `CompactionProgressed`, then `CompactionMade` or `CompactionNotMade`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.message import Message
from textual.screen import Screen

from velo_chat.engine import ResumePreview, TurnStats
from velo_chat.engine.config import Profile, ReasoningSettings
from velo_chat.store import Message as StoredMessage
from velo_chat.store import Session, StoreError

from ..dialogs.message import error_dialog
from ..generation_compaction import CompactRequest, run_compaction
from ..messages import CompactionMade, CompactionNotMade, CompactionProgressed, TurnAccepted
from ..widgets.composer.composer import Composer
from ..widgets.telemetry.panel import LivePanel
from ..widgets.transcript.message import MessageView
from ..widgets.transcript.transcript import Transcript

if TYPE_CHECKING:
    from .base import RunningApp, RunWorker
    from .chat_sessions import Sessions

COMPACT_COMMAND = "/compact"

WHAT_HAPPENS = {
    "compact": "sending compacts this session into a continuation first",
    "drop_oldest": "sending drops the oldest turns from the model's view first",
}
"""What sending does once the context is full, by `context.when_full` ("refuse": `fill_warning`)."""


def compact_focus(text: str) -> str | None:
    """What a `/compact [focus]` message asks the summary to focus on ("" for nothing in
    particular), or None when `text` is not that command."""
    stripped = text.strip()
    if stripped != COMPACT_COMMAND and not stripped.startswith(COMPACT_COMMAND + " "):
        return None
    return stripped[len(COMPACT_COMMAND) :].strip()


def fill_warning(prompt_tokens: int, n_ctx: int, profile: Profile) -> str:
    """The line under the composer once the next turn fills `context.compact_at` of the context
    (or would not fit): what sending will do, by `context.when_full`. "" below that, or when
    the prompt's size is not known (a remote engine)."""
    context = profile.context
    if prompt_tokens <= 0 or n_ctx <= 0:
        return ""
    fraction = prompt_tokens / n_ctx
    fits = prompt_tokens < n_ctx
    if fraction < context.compact_at and fits:
        return ""
    head = f"[b $warning]context {fraction:.0%} full[/]"
    policy = context.when_full
    if policy in WHAT_HAPPENS:
        return f"{head}: {WHAT_HAPPENS[policy]} (context.when_full = {policy})"
    setting = f"context.when_full = {policy}; /compact makes room"
    if fits:
        return f"{head}: a turn that does not fit will be refused ({setting})"
    return f"{head}: sending is refused ({setting})"


def turns_left(fill_tokens: int, turns: int, n_ctx: int, profile: Profile) -> int | None:
    """About how many more turns of the session's average size (`fill_tokens` over `turns`)
    fit before `context.when_full` acts: at `compact_at` of the context, or its end under
    "refuse" (the reckoning of `compaction.fill`). None when not known."""
    context = profile.context
    if fill_tokens <= 0 or turns <= 0 or n_ctx <= 0:
        return None
    limit = n_ctx if context.when_full == "refuse" else context.compact_at * n_ctx
    return max(0, int((limit - fill_tokens) // (fill_tokens / turns)))


def turns_in_view(messages: Sequence[StoredMessage], view_start: int) -> int:
    """The user's turns the model still sees (those from `view_start` on)."""
    return sum(1 for m in messages if m.role == "user" and m.position >= view_start)


def view_start_message(messages: Sequence[StoredMessage], view_start: int) -> int | None:
    """The id of the first message the model sees, where older ones left its view (None: it
    sees them all)."""
    if view_start <= 0:
        return None
    return next((m.id for m in messages if m.position >= view_start), None)


def made_notice(msg: CompactionMade) -> str:
    turns = "1 turn" if msg.kept_turns == 1 else f"{msg.kept_turns:,} turns"
    return (
        f"Compacted into a continuation: {turns} kept verbatim, summary {msg.summary_tokens:,} "
        "tokens; the original stays whole."
    )


class Compaction:
    """`/compact` while it runs, and what a full context shows between and during turns."""

    def __init__(
        self,
        app: RunningApp,
        *,
        post: Callable[[Message], object],
        run_worker: RunWorker,
        sessions: Sessions,
        transcript: Callable[[], Transcript],
        panel: Callable[[], LivePanel],
        composer: Callable[[], Composer],
        show_line: Callable[[str], None],
        notify: Callable[..., None],
        push_screen: Callable[[Screen[Any]], object],
        session_changed: Callable[[], None],
    ) -> None:
        """`sessions` is the screen's (the active session: a continuation made here becomes
        it); `show_line` writes the line under the composer; `session_changed` is called when
        the active session is replaced (the header shows it)."""
        self._app = app
        self._post = post
        self._run_worker = run_worker
        self._sessions = sessions
        self._transcript = transcript
        self._panel = panel
        self._composer = composer
        self._show_line = show_line
        self._notify = notify
        self._push_screen = push_screen
        self._session_changed = session_changed
        self.running = False  # a `/compact` runs (the screen is busy meanwhile)

    # -- /compact --------------------------------------------------------------------------------

    def refusal(self, session: Session | None, *, ready: bool) -> str:
        """Why `/compact` cannot start now (there is no session yet, or the model is not ready,
        or a reply or compaction runs)."""
        if session is None:
            return "A new session has nothing to compact yet: send a message first."
        if not ready:
            return "The model is not loaded yet: /compact stays in the input; send it when it is."
        return "A reply or a compaction is running: send /compact again when it ends."

    def start(
        self,
        session: Session,
        focus: str,
        *,
        text: str,
        cancel: threading.Event,
        reasoning: ReasoningSettings | None,
    ) -> None:
        """Summarize `session` into a continuation in the background (`cancel` stops it).
        `text` is the command as typed: given back if nothing is made."""
        self.running = True
        request = CompactRequest(session, self._app.profile, text, focus or None, reasoning)
        work = partial(run_compaction, self._app.host, self._app.store, request, self._post, cancel)
        self._run_worker(work, name="_compact", group="generation", exclusive=True, thread=True)
        self._show_line("[b]compacting[/b] this session into a continuation… Esc cancels")

    def progress(self, msg: CompactionProgressed) -> None:
        p = msg.prefill
        if p is not None and p.done < p.total:
            self._show_line(f"[b]compacting[/b]: prefilling the request {p.done:,}/{p.total:,} · Esc cancels")
        elif msg.n_tokens:
            self._show_line(f"[b]compacting[/b]: summary {msg.n_tokens:,} tokens so far · Esc cancels")

    async def made(self, msg: CompactionMade) -> None:
        """The continuation opens; the original stays, with the continuation under it in the
        sidebar."""
        self.running = False
        messages: list[StoredMessage] = []
        with self._sessions.store_guard("Cannot read the continuation"):
            messages = self._app.store.messages(msg.continuation.id)
        self._sessions.active = msg.continuation
        await self._transcript().show_messages(messages)
        self._sessions.refresh()
        self._session_changed()
        self._panel().set_turns_left(None)  # the next turn's numbers say it again
        self._notify(made_notice(msg), timeout=8)

    def not_made(self, msg: CompactionNotMade) -> None:
        """Nothing was stored: the session is as it was, and the command goes back."""
        self.running = False
        self._composer().give_back(msg.text)
        self._push_screen(error_dialog("Nothing was compacted", msg.reason))

    # -- a turn that made room first -------------------------------------------------------------

    def making_room(self, line: str) -> None:
        """The turn's `context.when_full` acts before it (start_turn's `on_compact`)."""
        self._show_line(f"[b]{line.rstrip(' .')}…[/b] Esc stops")

    async def accepted(self, msg: TurnAccepted, user_view: MessageView | None) -> None:
        """A turn was accepted: when it compacted the session first, the transcript shows the
        continuation's messages before the turn's own; where the model's view begins is marked."""
        if msg.compacted_from is not None and user_view is not None:
            earlier = [m for m in self._messages(msg.session) if m.position < msg.user.position]
            await self._transcript().replace_history(user_view, earlier)
            title = msg.compacted_from.title or "untitled"
            self._notify(
                f"The context was full: the conversation goes on in a continuation; “{title}” stays whole.",
                timeout=6,
            )
        await self.show_view_start(msg.session)

    async def show_view_start(self, session: Session | None) -> None:
        """Mark the first message the model still sees (no mark when it sees them all)."""
        first = None
        if session is not None and session.view_start > 0:
            first = view_start_message(self._messages(session), session.view_start)
        await self._transcript().mark_view_start(first)

    def turn_ended(self, stats: TurnStats | None, session: Session | None) -> None:
        """The live panel's turns left, at the session's average tokens per turn so far (the
        turn's context fill over the turns the model sees)."""
        if stats is None or session is None:
            return
        panel = self._panel()
        fill_tokens = stats.prompt_tokens + stats.decode_tokens
        turns = turns_in_view(self._messages(session), session.view_start)
        panel.set_turns_left(turns_left(fill_tokens, turns, panel.n_ctx, self._app.profile))

    def preview_warning(self, preview: ResumePreview, n_ctx: int, session: Session | None) -> str:
        """The fill warning for sending the draft now ("" when none). A new session's first
        turn and a revision (a fork) do not make room: the warning is for the session's turns."""
        if session is None:
            return ""
        return fill_warning(preview.prompt_tokens, n_ctx, self._app.profile)

    def _messages(self, session: Session) -> list[StoredMessage]:
        try:
            return self._app.store.messages(session.id)
        except StoreError:
            return []
