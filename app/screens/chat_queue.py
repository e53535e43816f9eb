"""Messages typed while a reply streams: the queue below the transcript.

Enter during a reply queues the message instead of refusing it. Each queued message is a draft
in the session store from the moment it is queued (`SessionStore.add_draft`), so a quit or a
crash loses none of them: reopening the session finds them again, and the screen offers to send
them. When a turn ends the next one is sent (`Queue.next`), in order. Stopping a reply pauses the
queue (the user stopped for a reason: nothing more is sent behind their back), and so does a
failed turn; a key sends the queue again. A queued message can be taken back to the composer to
edit: it keeps its place, and the queue waits for it rather than send the ones behind it first.

A message queued before the session exists (during the first turn of a new session, before the
engine accepted it) waits in memory and is stored as soon as the session is (`session_ready`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from velo_chat.store import Attachment, Session, SessionStore, StoreError

from ..widgets.composer.queue import MessageQueue, QueuedItem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Queued:
    key: int  # the draft's id once stored; negative while only in memory
    text: str
    attachments: tuple[Attachment, ...] = ()
    stored: bool = False


class Queue:
    """The queue's state; the widget shows it (`MessageQueue`)."""

    def __init__(
        self,
        store: Callable[[], SessionStore],
        *,
        widget: Callable[[], MessageQueue],
        session: Callable[[], Session | None],
        resume_key: Callable[[], str],
    ) -> None:
        self._store = store
        self._widget = widget
        self._session = session
        self._resume_key = resume_key
        self.items: list[Queued] = []
        self.paused = False
        self.editing: int | None = None  # the key of the item taken back to the composer
        self._memory_keys = itertools.count(-1, -1)

    def __len__(self) -> int:
        return len(self.items)

    # -- what the user does ---------------------------------------------------------------------

    def add(self, text: str, attachments: Sequence[Attachment]) -> str | None:
        """Queue a message (stored as a draft at once). Returns a store error's text, if the
        draft could not be written (the message stays queued in memory, and is said so)."""
        item = Queued(next(self._memory_keys), text, tuple(attachments))
        self.items.append(item)
        error = self._store_item(item)
        self._show()
        return error

    def replace_edited(self, text: str, attachments: Sequence[Attachment]) -> str | None:
        """The item taken back to edit comes back with its new text, in its place."""
        key, self.editing = self.editing, None
        index = next((i for i, item in enumerate(self.items) if item.key == key), None)
        if index is not None:
            edited = replace(self.items[index], text=text, attachments=tuple(attachments))
            self.items[index] = edited
            error = None
            if edited.stored:
                error = self._write(lambda s: s.update_draft(edited.key, text, attachments))
            self._show()
            return error
        return self.add(text, attachments)  # removed meanwhile: queued again at the end

    def edit(self, key: int) -> Queued | None:
        """Take an item back to the composer (it keeps its place; the queue waits for it)."""
        item = self._find(key)
        if item is not None:
            self.editing = key
            self._show()
        return item

    def stop_editing(self) -> None:
        self.editing = None
        self._show()

    def remove(self, key: int) -> None:
        item = self._find(key)
        if item is None:
            return
        self.items.remove(item)
        if self.editing == key:
            self.editing = None
        if item.stored:
            self._write(lambda s: s.delete_draft(item.key))
        self._show()

    def pause(self) -> None:
        self.paused = True
        self._show()

    def resume(self) -> None:
        self.paused = False
        self._show()

    # -- the turns ------------------------------------------------------------------------------

    def next(self) -> Queued | None:
        """The message to send now, taken off the queue (and out of the store), or None: empty,
        paused, or the head is being edited."""
        if self.paused or not self.items or self.items[0].key == self.editing:
            return None
        item = self.items.pop(0)
        if item.stored:
            self._write(lambda s: s.delete_draft(item.key))
        self._show()
        return item

    def session_ready(self, session: Session) -> None:
        """The session now exists: store what was queued before it did."""
        for item in list(self.items):
            if not item.stored:
                self._store_item(item, session)
        self._show()

    def load(self, session: Session | None) -> int:
        """Show the drafts stored for `session` (another session's queue is dropped from view,
        not from the store). They come back paused; returns how many there are."""
        self.items, self.editing = [], None
        if session is not None:
            try:
                drafts = self._store().drafts(session.id)
            except StoreError:
                log.warning("could not read the queued messages of %s", session.id, exc_info=True)
                drafts = []
            self.items = [Queued(d.id, d.text, d.attachments, stored=True) for d in drafts]
        self.paused = bool(self.items)
        self._show()
        return len(self.items)

    # -- the store and the widget ---------------------------------------------------------------

    def _find(self, key: int) -> Queued | None:
        return next((item for item in self.items if item.key == key), None)

    def _store_item(self, item: Queued, session: Session | None = None) -> str | None:
        session = session or self._session()
        if session is None:
            return None
        try:
            draft = self._store().add_draft(session.id, item.text, item.attachments)
        except StoreError as exc:
            log.warning("could not store a queued message: %s", exc)
            return str(exc)
        stored = replace(item, key=draft.id, stored=True)
        self.items[self.items.index(item)] = stored
        if self.editing == item.key:
            self.editing = stored.key
        return None

    def _write(self, change: Callable[[SessionStore], object]) -> str | None:
        try:
            change(self._store())
        except StoreError as exc:
            log.warning("could not update the queued messages: %s", exc)
            return str(exc)
        return None

    def _show(self) -> None:
        hint = f"{self._resume_key()} sends the next message" if self.paused else ""
        self._widget().show(
            [
                QueuedItem(item.key, item.text, len(item.attachments), editing=item.key == self.editing)
                for item in self.items
            ],
            paused=self.paused and bool(self.items),
            paused_hint=hint,
        )
