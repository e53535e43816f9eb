"""The scrolling list of messages. While a reply streams it follows the bottom (Textual's
`anchor`), and lets go as soon as the user scrolls up."""

from __future__ import annotations

from collections.abc import Sequence

from textual.containers import VerticalScroll
from textual.widgets import Static

from velo_chat.store import Message

from .message import MessageView

EMPTY_TEXT = (
    "[b]No messages yet.[/b]\n\nType below and press [b]Enter[/b] to send "
    "([b]Ctrl+J[/b] for a new line).\n[b]Ctrl+P[/b] opens the command palette, [b]F1[/b] the "
    "list of keys."
)


class Transcript(VerticalScroll, can_focus=False):
    def __init__(self, *, show_thinking: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.show_thinking = show_thinking

    def compose(self):
        yield Static(EMPTY_TEXT, id="transcript-empty")

    async def show_messages(self, messages: Sequence[Message]) -> None:
        await self.remove_children(MessageView)
        views = [
            MessageView(
                m.role,
                m.content,
                reasoning=m.reasoning,
                status=m.status,
                message_id=m.id,
                show_thinking=self.show_thinking,
            )
            for m in messages
            if m.role != "system"
        ]
        self.query_one("#transcript-empty").display = not views
        if views:
            await self.mount_all(views)
        self.scroll_end(animate=False, immediate=False)

    async def add_message(self, view: MessageView) -> MessageView:
        self.query_one("#transcript-empty").display = False
        await self.mount(view)
        return view

    def set_show_thinking(self, show: bool) -> None:
        """Show or hide every message's reasoning (the profile's `reasoning.show_thinking`)."""
        self.show_thinking = show
        for view in self.query(MessageView):
            view.set_show_thinking(show)

    def follow(self) -> None:
        self.anchor()

    def views(self) -> list[MessageView]:
        return list(self.query(MessageView))

    def last_reply(self) -> MessageView | None:
        replies = [v for v in self.views() if v.role == "assistant"]
        return replies[-1] if replies else None
