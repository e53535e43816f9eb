"""The chat screen's running turn as it shows: the user's message and the streaming reply in the
transcript, the live panel, the line under the composer, and what the end of a turn tells the
user. `ChatScreen` owns one `TurnView` and its handlers of the generation worker's messages call
it; what it uses is given to it: the widgets it writes to and the screen's notify and dialogs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from textual.screen import Screen

from velo_chat.engine import ResumePreview

from ..dialogs.message import error_dialog
from ..messages import PrefillUpdated, TokensStreamed, TurnAccepted, TurnBegan, TurnEnded
from ..widgets.telemetry.panel import LivePanel
from ..widgets.transcript.files import AttachedFile
from ..widgets.transcript.message import MessageView
from ..widgets.transcript.transcript import Transcript


def resume_line(
    preview: ResumePreview | None, thinks: bool | None, file_tokens: int | None = None, n_files: int = 0
) -> str:
    """The line under the composer between turns: what sending the draft would reuse and
    prefill (None: unknown) and its estimated time at this machine's measured prefill rate, how
    many tokens the attached files add, and whether the next turn thinks (None: no switch).
    A new session's first turn that reuses the system prompt saved by an earlier session says
    so: "(system prompt)"."""
    line = ""
    if preview is not None:
        p = preview
        est = f" ≈ {p.est_prefill_s:.1f} s" if p.est_prefill_s is not None else ""
        shared = " (system prompt)" if 0 < p.cached_tokens == p.shared_prefix_tokens else ""
        line = f"reuses {p.cached_tokens:,} cached tokens{shared} · prefills {p.prefill_tokens:,}{est}"
        if p.source == "server":
            line = "remote: the server keeps its own prompt cache"
    if n_files:
        noun = "file" if n_files == 1 else "files"
        counted = f"{file_tokens:,} tokens" if file_tokens is not None else "tokens not counted yet"
        line = f"{n_files} {noun}: {counted}" + (f" · {line}" if line else "")
    if thinks is not None:
        line = f"thinking {'on' if thinks else 'off'}" + (f" · {line}" if line else "")
    return line


class TurnView:
    """The views of the turn that runs (none between turns)."""

    def __init__(
        self,
        *,
        transcript: Callable[[], Transcript],
        panel: Callable[[], LivePanel],
        show_line: Callable[[str], None],
        notify: Callable[..., None],
        push_screen: Callable[[Screen[Any]], object],
    ) -> None:
        """`show_line` writes the line under the composer; `notify` and `push_screen` are the
        screen's and the app's (notices and dialogs at the end of a turn)."""
        self._transcript = transcript
        self._panel = panel
        self._show_line = show_line
        self._notify = notify
        self._push_screen = push_screen
        self.user: MessageView | None = None
        self.reply: MessageView | None = None  # streams the reply
        self._line_says_prefill = False  # the line under the composer shows prefill progress

    async def begin(
        self, text: str, *, show_thinking: bool, attachments: Sequence[AttachedFile] = ()
    ) -> None:
        """The user's message (its attached files folded above its text) and an empty reply, at
        the end of the transcript."""
        transcript = self._transcript()
        transcript.freeze_history()  # before the new messages: they count only once laid out
        self.user = await transcript.add_message(MessageView("user", text, attachments=attachments))
        self.reply = await transcript.add_message(
            MessageView("assistant", streaming=True, show_thinking=show_thinking)
        )
        transcript.scroll_end(animate=False)
        transcript.follow()
        self._panel().turn_sent()
        self._show_line("[i]thinking… Esc stops[/i]")
        self._line_says_prefill = False

    async def remove(self) -> None:
        """The turn was rejected: its views go."""
        for view in (self.user, self.reply):
            if view is not None:
                await view.remove()

    def accepted(self, msg: TurnAccepted) -> None:
        if self.reply is not None:
            self.reply.message_id = msg.reply.id
        if self.user is not None:
            self.user.message_id = msg.user.id

    def began(self, msg: TurnBegan) -> None:
        self._panel().turn_began(msg.started, msg.n_ctx)

    def prefill(self, msg: PrefillUpdated) -> None:
        self._panel().prefill(msg.progress)
        p = msg.progress
        self._show_line(f"prefilling {p.done:,}/{p.total:,} · ETA {p.eta_s:.1f} s · Esc stops")
        self._line_says_prefill = True

    async def tokens(self, msg: TokensStreamed) -> None:
        if self._line_says_prefill:  # the prefill is over: its progress would read stale
            self._line_says_prefill = False
            self._show_line("[i]replying… Esc stops[/i]")
        if self.reply is not None:
            self._transcript().freeze_history()  # what the reply pushed up since
            await self.reply.stream_text(msg.text, msg.reasoning)
        self._panel().tokens(
            msg.n_tokens,
            msg.t_first,
            msg.t_last,
            n_reasoning=msg.n_reasoning,
            answering=bool(msg.text),
            samples=msg.samples,
        )

    async def ended(self, msg: TurnEnded) -> None:
        """The reply's final text and status, and the panel's turn stats."""
        if self.reply is not None:
            reply = msg.reply
            # What streamed on screen wins over the stored row, which may lag a flush behind
            # or not have been written at all.
            text = msg.text if msg.text is not None else (reply.content if reply else self.reply.text)
            reasoning = (
                msg.reasoning
                if msg.text is not None
                else (reply.reasoning if reply else self.reply.reasoning)
            )
            status = "error" if msg.failed else (reply.status if reply else "interrupted")
            await self.reply.finish(text, status, reply.id if reply else None, reasoning)
        self._panel().turn_ended(msg.stats)

    def end(self) -> None:
        """No turn runs any more (ended or rejected)."""
        self._transcript().thaw()
        self.user = self.reply = None
        self._show_line("")

    def tell(self, msg: TurnEnded) -> None:
        """What the user must know about how the turn ended: a failure, a reply the store
        refused, a reply cut at the end of the context."""
        if msg.failed:
            self._notify(f"The reply failed: {msg.failed}", severity="error", timeout=8)
        elif msg.empty_reason:
            self._notify(f"The reply is empty: {msg.empty_reason}.", severity="warning", timeout=8)
        if not msg.saved:
            self._push_screen(
                error_dialog(
                    "The reply was not saved",
                    f"The session store refused it ({msg.save_error}). "
                    "The reply is shown here but will not be in the session after a restart: "
                    "copy what you need.",
                )
            )
        elif msg.stats is not None and msg.stats.finish_reason == "context":
            self._notify(
                "The reply stopped at the end of the context window. Start a new "
                "session (Ctrl+N) or raise context.n_ctx in the profile.",
                severity="warning",
                timeout=10,
            )
