"""The sessions sidebar: a filter box over the session list, a tree most recent first.

It only shows what the chat screen hands it (`show`) and posts what the user did
(`FilterChanged`, `Selected`); the screen queries the store. Session keys (rename, delete, fork,
export) are bindings on the list that run the screen's actions.

A fork is listed under the session it came from (`session_tree`), so a conversation and its
branches read as one thing; the tree follows `parent_session_id` and nothing else, so any later
kind of "derived from" session that sets it lands in the same place. A continuation (a session
carried on after compaction, docs/compaction.md) is one: it sits under the session it summarized,
labelled "⤷ … (continued)" (`session_label`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
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


MAX_INDENT_LEVELS = 4
"""Deeper forks stop indenting further: a narrow sidebar must still show their titles."""


def session_tree(sessions: Iterable[Session]) -> list[tuple[Session, int]]:
    """Every session once, as (session, depth) in display order: each top-level session (no
    parent, or a parent not among `sessions`) most recent first, each followed by its children
    (most recent first, depth + 1) and theirs.

    The relation is exactly `parent_session_id`. A filtered list can lose a parent: its child then
    shows at top level, so a match is never hidden. Broken data (a session its own parent, or a
    parent cycle) must not hide sessions or loop: what the walk from the roots did not reach is
    walked again from its most recent member, which stands in as a root.
    """
    ordered = _most_recent_first(sessions)
    ids = {s.id for s in ordered}
    children: dict[str, list[Session]] = {}
    for s in ordered:
        if _has_shown_parent(s, ids):
            children.setdefault(s.parent_session_id or "", []).append(s)
    roots = [s for s in ordered if not _has_shown_parent(s, ids)]
    out: list[tuple[Session, int]] = []
    seen: set[str] = set()
    for root in roots + ordered:  # the second pass only finds what cycles kept from the roots
        if root.id not in seen:
            _walk(root, children, seen, out)
    return out


def _most_recent_first(sessions: Iterable[Session]) -> list[Session]:
    """Unique by id (first wins), newest `updated_at` first; ties keep the caller's order."""
    unique: dict[str, Session] = {}
    for s in sessions:
        unique.setdefault(s.id, s)
    return sorted(unique.values(), key=lambda s: -s.updated_at)


def _has_shown_parent(session: Session, shown_ids: set[str]) -> bool:
    parent = session.parent_session_id
    return parent is not None and parent != session.id and parent in shown_ids


def _walk(
    root: Session, children: dict[str, list[Session]], seen: set[str], out: list[tuple[Session, int]]
) -> None:
    """Depth-first from `root`, without recursion: a long chain of derived sessions must not hit
    Python's recursion limit."""
    stack = [(root, 0)]
    while stack:
        session, depth = stack.pop()
        if session.id in seen:
            continue
        seen.add(session.id)
        out.append((session, depth))
        kids = children.get(session.id, [])
        stack.extend((kid, depth + 1) for kid in reversed(kids))


CONTINUED = " (continued)"


def session_label(session: Session) -> str:
    """The title as listed: a continuation (made by compacting its parent, which it sits under)
    is marked "⤷ … (continued)", so the chain reads as one conversation carried on."""
    title = session.title or "untitled"
    if not session.continues:
        return title
    return "⤷ " + (title if title.endswith(CONTINUED) else title + CONTINUED)


def tree_prefix(depth: int) -> str:
    """The indentation before a title: none at top level, a branch mark under a parent."""
    if depth <= 0:
        return ""
    return "  " * (min(depth, MAX_INDENT_LEVELS) - 1) + "└ "


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
        """List `sessions` as a tree (forks under their parent). `self.sessions` holds them in
        display order, so an option's index is its session's index."""
        tree = session_tree(sessions)
        self.sessions, self.active_id = [s for s, _ in tree], active_id
        now = self.clock()
        lst = self.query_one(SessionList)
        lst.clear_options()
        lst.add_options([self._option(s, depth, now) for s, depth in tree])
        if active_id and any(s.id == active_id for s in self.sessions):
            lst.highlighted = next(i for i, s in enumerate(self.sessions) if s.id == active_id)

    def _option(self, session: Session, depth: int, now: float) -> Option:
        title = session_label(session).replace("[", r"\[")
        mark = "▶ " if session.id == self.active_id else "  "
        label = f"{mark}{tree_prefix(depth)}{title} [dim]{age(now - session.updated_at)}[/]"
        return Option(label, id=session.id)

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
