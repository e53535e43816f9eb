"""The sessions sidebar: a filter box over the session list, most recent first.

It only shows what the chat screen hands it (`show`) and posts what the user did
(`FilterChanged`, `Selected`); the screen queries the store. Session keys (rename, delete, fork,
export) are bindings on the list that run the screen's actions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

from velo_chat.store import Session

from ... import keymap


def age(seconds: float) -> str:
    if seconds < 60:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return "now"


class SessionList(OptionList):
    BINDINGS = keymap.bindings("sessions")


class SessionSidebar(Vertical):
    @dataclass
    class FilterChanged(Message):
        query: str

    @dataclass
    class Selected(Message):
        session_id: str

    def __init__(
        self, *, clock: Callable[[], float] = time.time, cursor_blink: bool = True, id: str | None = None
    ) -> None:
        super().__init__(id=id)
        self.clock = clock
        self.cursor_blink = cursor_blink
        self.sessions: list[Session] = []
        self.active_id: str | None = None

    def compose(self) -> ComposeResult:
        filter_box = Input(placeholder="filter sessions…", id="session-filter")
        filter_box.cursor_blink = self.cursor_blink
        yield filter_box
        yield SessionList(id="session-list")

    def show(self, sessions: Sequence[Session], active_id: str | None) -> None:
        self.sessions, self.active_id = list(sessions), active_id
        now = self.clock()
        lst = self.query_one(SessionList)
        lst.clear_options()
        for s in self.sessions:
            title = (s.title or "untitled").replace("[", r"\[")
            mark = "▶ " if s.id == active_id else "  "
            lst.add_option(Option(f"{mark}{title} [dim]{age(now - s.updated_at)}[/]", id=s.id))
        if active_id and any(s.id == active_id for s in self.sessions):
            lst.highlighted = next(i for i, s in enumerate(self.sessions) if s.id == active_id)

    def highlighted_id(self) -> str | None:
        lst = self.query_one(SessionList)
        if lst.highlighted is None or lst.highlighted >= len(self.sessions):
            return None
        return self.sessions[lst.highlighted].id

    @on(Input.Changed, "#session-filter")
    def _filter(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.FilterChanged(event.value))

    @on(Input.Submitted, "#session-filter")
    def _to_list(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(SessionList).focus()

    @on(OptionList.OptionSelected, "#session-list")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.post_message(self.Selected(event.option.id))
