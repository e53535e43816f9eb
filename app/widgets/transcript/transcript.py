"""The scrolling list of messages. While a reply streams it follows the bottom (Textual's
`anchor`), and lets go as soon as the user scrolls up.

While a reply streams, the messages more than a screen above the viewport are stood down
(`freeze_history`, again as the reply grows and pushes more of them up): hidden, with one empty
block of exactly their height in their place, so the scroll position and the scrollbar do not
move. Each streamed update makes Textual lay out every widget on the screen, and a long session's
messages are hundreds of Markdown block widgets: that layout was most of the UI thread's time,
and the UI thread's time is taken from the decode on a small machine (`app/stream_pacer.py`).
They come back (`thaw`) when the reply ends, when the user scrolls up, and when the transcript
changes width (their heights would change).

When the oldest turns have left the model's view (`drop_oldest`, docs/compaction.md) a marker
line stands before the first message the model still sees (`mark_view_start`); it is a row like a
message, so standing the history down hides it with them.

It also says how wide its code is (`widest_code_line`, `code_gutter`): the screen hides side panes
while the transcript is too narrow for a code line (`panes.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from textual import events
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from velo_chat.store import Message

from .code import WrappedCode
from .highlight import warm_lexers
from .message import CodeWidthChanged, MessageView, ViewStartMarker

# The columns of the transcript's width a code row cannot use, by chat.tcss: the transcript's
# padding (1 + 1) and scrollbar (2), a message's border (1) and padding (1 + 1), the code's
# padding (2 + 2). Measured on a shown code block where there is one (`code_gutter`).
CODE_GUTTER = 11

EMPTY_TEXT = (
    "[b]No messages yet.[/b]\n\nType below and press [b]Enter[/b] to send "
    "([b]Ctrl+J[/b] for a new line).\n[b]Ctrl+P[/b] opens the command palette, [b]F1[/b] the "
    "list of keys."
)


class Transcript(VerticalScroll, can_focus=False):
    def __init__(self, *, show_thinking: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.show_thinking = show_thinking

        self._frozen: list[Widget] = []  # rows: messages, and the view-start marker among them
        self._frozen_top = 0  # where the first stood-down message began
        self._frozen_width = 0

    def compose(self):
        yield Static(EMPTY_TEXT, id="transcript-empty")
        stand_in = Static("", id="transcript-frozen")
        stand_in.display = False
        yield stand_in

    def on_mount(self) -> None:
        # While the model loads, off the UI thread: the first code block's lexer then costs
        # the decode nothing (`highlight.warm_lexers`).
        self.run_worker(warm_lexers, thread=True, group="warm-lexers", exit_on_error=False)

    def _views_of(self, messages: Sequence[Message]) -> list[MessageView]:
        return [
            MessageView(
                m.role,
                m.content,
                reasoning=m.reasoning,
                status=m.status,
                message_id=m.id,
                show_thinking=self.show_thinking,
                attachments=m.attachments,
                tool_calls=m.tool_calls,
                tool_results=m.tool_results,
            )
            for m in messages
            if m.role != "system"
        ]

    async def show_messages(self, messages: Sequence[Message]) -> None:
        self.thaw()
        await self.remove_children(self._rows())
        views = self._views_of(messages)
        self.query_one("#transcript-empty").display = not views
        if views:
            await self.mount_all(views)
        self.scroll_end(animate=False, immediate=False)
        if self.widest_code_line():
            self.post_message(CodeWidthChanged())

    async def insert_before(self, view: MessageView, messages: Sequence[Message]) -> None:
        """Show stored `messages` before `view` (messages another process added to the session
        before the turn `view` starts)."""
        views = self._views_of(messages)
        if views:
            self.thaw()
            await self.mount_all(views, before=view)

    async def replace_history(self, before: MessageView, messages: Sequence[Message]) -> None:
        """Show stored `messages` in place of everything above `before` (the running turn's
        message): the session changed under the turn (it was compacted into a continuation
        first), and the turn now follows the continuation's messages."""
        self.thaw()
        rows = self._rows()
        above = rows[: rows.index(before)] if before in rows else []
        await self.remove_children(above)
        views = self._views_of(messages)
        if views:
            await self.mount_all(views, before=before)

    async def mark_view_start(self, message_id: int | None) -> None:
        """Put the view-start marker before the message `message_id` (None, or a message not
        shown: no marker). A no-op when it stands there already: each turn asks, and a change
        lays the whole transcript out again."""
        rows = self._rows()
        first = next((v for v in self.views() if message_id is not None and v.message_id == message_id), None)
        markers = [i for i, row in enumerate(rows) if isinstance(row, ViewStartMarker)]
        if markers == ([rows.index(first) - 1] if first is not None else []):
            return
        self.thaw()
        await self.remove_children(ViewStartMarker)
        if first is not None:
            await self.mount(ViewStartMarker(), before=first)

    async def add_message(self, view: MessageView) -> MessageView:
        self.query_one("#transcript-empty").display = False
        await self.mount(view)
        if view.code_width():
            self.post_message(CodeWidthChanged())
        return view

    def widest_code_line(self) -> int:
        """The widest line of code in the messages shown, in cells (0: no code)."""
        return max((view.code_width() for view in self.views()), default=0)

    def code_gutter(self) -> int:
        """How many columns narrower than the transcript its code rows are: measured on a code
        block that is laid out (the one with the widest rows: one nested in a list is narrower),
        else `CODE_GUTTER` (the messages of a session just opened are not laid out yet)."""
        widths = [rows.content_size.width for rows in self.query(WrappedCode) if rows.content_size.width]
        return self.outer_size.width - max(widths) if widths else CODE_GUTTER

    def set_show_thinking(self, show: bool) -> None:
        """Show or hide every message's reasoning (the profile's `reasoning.show_thinking`)."""
        self.show_thinking = show
        self.thaw()  # the stand-in's height would be wrong
        for view in self.query(MessageView):
            view.set_show_thinking(show)

    def follow(self) -> None:
        self.anchor()

    # -- standing the history down while a reply streams ------------------------------------

    def freeze_history(self) -> None:
        """Hide the messages that end more than a screen above the viewport, behind a stand-in
        of their height. Only messages already laid out count, so call it before the newly
        mounted ones matter (they are at the bottom anyway). Called again while a reply grows,
        it stands down what has scrolled away since (a no-op when nothing has)."""
        keep_from = self.scroll_y - self.size.height
        rows = self._rows()
        hidden: list[Widget] = []
        for row in rows[len(self._frozen) :]:
            region = row.virtual_region_with_margin
            if not row.display or region.height == 0 or region.bottom > keep_from:
                break
            hidden.append(row)
        if not hidden:
            return
        if not self._frozen:
            self._frozen_top = hidden[0].virtual_region_with_margin.y
        stand_in = self.query_one("#transcript-frozen", Static)
        stand_in.styles.height = hidden[-1].virtual_region_with_margin.bottom - self._frozen_top
        with self.app.batch_update():
            stand_in.display = True
            for row in hidden:
                row.display = False
        self._frozen, self._frozen_width = self._frozen + hidden, self.size.width

    def thaw(self) -> None:
        """Show the stood-down messages again (a no-op when none are)."""
        if not self._frozen:
            return
        with self.app.batch_update():
            for row in self._frozen:
                row.display = True
            self.query_one("#transcript-frozen", Static).display = False
        self._frozen = []

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._frozen and new_value < old_value:  # the user scrolls up: give them everything
            self.thaw()

    def on_resize(self, event: events.Resize) -> None:
        if event.size.width != self._frozen_width:  # the hidden messages' heights changed
            self.thaw()

    def _rows(self) -> list[Widget]:
        """The messages and the view-start marker, in order (what `freeze_history` stands down)."""
        return [child for child in self.children if isinstance(child, (MessageView, ViewStartMarker))]

    def views(self) -> list[MessageView]:
        """The messages in order (children only: a query would walk every Markdown block)."""
        return [child for child in self.children if isinstance(child, MessageView)]

    def last_reply(self) -> MessageView | None:
        replies = [v for v in self.views() if v.role == "assistant"]
        return replies[-1] if replies else None
