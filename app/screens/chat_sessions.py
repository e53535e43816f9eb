"""The chat screen's session and copy actions, as two objects the screen owns: `Sessions`
(the active session, the sidebar's list, and what the user does to a session) and `Copying`.

Each session action targets the session highlighted in the sidebar when the list has focus,
else the active session; each is bound to a key (`keymap.py`) and offered in the command
palette. The screen's handlers and actions call these objects; what the objects use is given to
them: the app, the widgets they read and write, and callbacks into the screen.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from velo_chat.engine import ProfileError
from velo_chat.engine.config import atomic_write_text, exports_dir, list_profiles, load_profile
from velo_chat.store import Session, StoreError

from ..dialogs.choice import ChoiceDialog
from ..dialogs.confirm import ConfirmDialog
from ..dialogs.message import error_dialog
from ..dialogs.text_prompt import TextPrompt
from ..widgets.composer.composer import Composer
from ..widgets.sessions.sidebar import SessionList, SessionSidebar
from ..widgets.transcript.message import MessageView
from ..widgets.transcript.text import code_blocks
from ..widgets.transcript.transcript import Transcript

if TYPE_CHECKING:
    from textual.widget import Widget

    from .base import RunningApp

log = logging.getLogger(__name__)

Notify = Callable[..., None]  # a screen's `notify`


def header_text(session: Session | None, profile: str) -> str:
    """The line above the transcript: the session's title and the profile it runs on (a warning
    when that is not the session's own)."""
    if session is None:
        return f"[b]new session[/b] · profile {profile}"
    text = f"[b]{(session.title or 'untitled').replace('[', chr(92) + '[')}[/b]"
    if session.profile != profile:
        return text + (
            f" · [b $warning]session profile {session.profile}, running {profile}[/] (Ctrl+O switches)"
        )
    return text + f" · profile {profile}"


class Sessions:
    """The active session and the actions on sessions."""

    def __init__(
        self,
        app: RunningApp,
        *,
        notify: Notify,
        sidebar: Callable[[], SessionSidebar],
        session_list: Callable[[], SessionList],
        transcript: Callable[[], Transcript],
        composer: Callable[[], Composer],
        busy: Callable[[], bool],
        session_changed: Callable[[], None],
        request_preview: Callable[[], None],
        opened: Callable[[], None] = lambda: None,
    ) -> None:
        """`busy`: whether a reply streams (no switching then); `session_changed` is called
        when the active session is replaced or renamed (the screen's header shows it), `opened`
        when another session (or a new one) is opened (its queue and folder)."""
        self._app = app
        self._notify = notify
        self._sidebar = sidebar
        self._session_list = session_list
        self._transcript = transcript
        self._composer = composer
        self._busy = busy
        self._session_changed = session_changed
        self._request_preview = request_preview
        self._opened = opened
        self.active: Session | None = None  # None: a new session, made by its first turn
        self._filter = ""

    # -- the list -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def store_guard(self, title: str) -> Iterator[None]:
        """Run store calls; a `StoreError` (locked, full, read-only, damaged database) becomes
        an error dialog with its one-line reason instead of ending the app."""
        try:
            yield
        except StoreError as exc:
            log.warning("%s: %s", title, exc)
            self._app.push_screen(error_dialog(title, str(exc)))

    def refresh(self) -> None:
        with self.store_guard("Cannot list the sessions"):
            store = self._app.store
            sessions = store.list_sessions()
            q = self._filter.strip().lower()
            if q:  # the store escapes every query, so an error here is a real store problem
                hits = {h.session.id for h in store.search(q)}
                sessions = [s for s in sessions if q in (s.title or "").lower() or s.id in hits]
            active = self.active.id if self.active else None
            self._sidebar().show(sessions, active)

    def filter(self, query: str) -> None:
        self._filter = query
        self.refresh()

    async def open(self, session_id: str | None) -> None:
        if self._busy():
            self._notify("A reply is streaming: stop it (Esc) before switching.", severity="warning")
            return
        store = self._app.store
        loaded = None
        with self.store_guard("Cannot open the session"):
            loaded = (store.get_session(session_id), store.messages(session_id)) if session_id else (None, [])
        if loaded is None:
            return
        self.active, messages = loaded
        await self._transcript().show_messages(messages)
        self.refresh()
        self._session_changed()
        self._opened()
        self._composer().focus()
        self._request_preview()

    def _target(self) -> Session | None:
        if self._session_list().has_focus:
            sid = self._sidebar().highlighted_id()
            if sid:
                with self.store_guard("Cannot read the session"):
                    return self._app.store.get_session(sid)
                return None
        return self.active

    def _need_target(self) -> Session | None:
        target = self._target()
        if target is None:
            self._notify("No session selected.", severity="warning")
        return target

    # -- actions ------------------------------------------------------------------------------

    def rename(self) -> None:
        target = self._need_target()
        if target is None:
            return

        def done(title: str | None) -> None:
            if title:
                with self.store_guard("Rename failed"):
                    renamed = self._app.store.rename(target.id, title)
                    if self.active and self.active.id == target.id:
                        self.active = renamed
                        self._session_changed()
                self.refresh()

        self._app.push_screen(
            TextPrompt("Rename session", target.title or "", cursor_blink=self._app.cursor_blink), done
        )

    def delete(self) -> None:
        target = self._need_target()
        if target is None:
            return
        if self._busy() and self.active and self.active.id == target.id:
            self._notify("Stop the reply (Esc) before deleting this session.", severity="warning")
            return

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            deleted = False
            with self.store_guard("Delete failed"):
                self._app.store.delete(target.id)
                deleted = True
            if not deleted:
                return
            if self.active and self.active.id == target.id:
                await self.open(None)
            self.refresh()
            self._notify(f"Deleted “{target.title or 'untitled'}”.")

        self._app.push_screen(
            ConfirmDialog(
                "Delete session?",
                f"“{target.title or 'untitled'}” and all its messages will be "
                "deleted. This cannot be undone.",
                yes="Delete",
                no="Keep",
            ),
            done,
        )

    async def fork(self) -> None:
        target = self._need_target()
        if target is None:
            return
        fork = None
        with self.store_guard("Fork failed"):
            messages = self._app.store.messages(target.id)
            if not messages:
                self._notify("Nothing to fork: the session is empty.", severity="warning")
                return
            fork = self._app.store.fork(target.id, messages[-1].id)
        if fork is None:
            return
        await self.open(fork.id)
        self._notify(f"Forked into “{fork.title or 'untitled'}”.")

    def export(self) -> None:
        target = self._need_target()
        if target is None:
            return
        folder = exports_dir()  # 0700, and the file 0600: it is a whole conversation
        slug = re.sub(r"[^A-Za-z0-9]+", "-", target.title or "untitled").strip("-")[:40]
        path = folder / f"{slug or 'session'}-{target.id[:8]}.md"
        try:
            with self.store_guard("Export failed"):
                atomic_write_text(path, self._app.store.export_markdown(target.id))
        except OSError as exc:
            self._app.push_screen(error_dialog("Export failed", f"{path}: {exc.strerror}"))
            return
        self._notify(f"Exported to {path}", timeout=6)

    def switch_profile(self) -> None:
        """Run this session on another profile (explicit: the session remembers it)."""
        if self._busy():
            self._notify("Stop the reply (Esc) first.", severity="warning")
            return
        choices = [(p.name, f"{p.name} [dim]({p.source})[/]") for p in list_profiles()]

        def done(name: str | None) -> None:
            if not name:
                return
            try:
                profile = load_profile(name)
            except ProfileError as exc:
                self._app.push_screen(error_dialog("Profile not usable", str(exc)))
                return
            if self.active is not None:
                with self.store_guard("Cannot change the session's profile"):
                    self.active = self._app.store.update_session(self.active.id, profile=name)
            self._app.use_profile(profile)
            self._session_changed()

        self._app.push_screen(
            ChoiceDialog("Switch this session's profile", choices, self._app.profile.name), done
        )


class Copying:
    """Copying a reply, or the code blocks in it, to the clipboard: the focused message, else
    the last reply (with a code block, for code)."""

    def __init__(
        self,
        *,
        transcript: Callable[[], Transcript],
        focused: Callable[[], Widget | None],
        copy_to_clipboard: Callable[[str], None],
        notify: Notify,
    ) -> None:
        self._transcript = transcript
        self._focused = focused
        self._copy_to_clipboard = copy_to_clipboard
        self._notify = notify

    def _target(self, need_code: bool = False) -> MessageView | None:
        focused = self._focused()
        if isinstance(focused, MessageView):
            return focused
        views = [v for v in self._transcript().views() if v.role == "assistant"]
        if need_code:
            views = [v for v in views if code_blocks(v.answer_text())]
        return views[-1] if views else None

    def message(self) -> None:
        view = self._target()
        if view is None:
            self._notify("No message to copy.", severity="warning")
            return
        self._copy_to_clipboard(view.answer_text())
        self._notify("Copied the message.", timeout=2)

    def code(self) -> None:
        view = self._target(need_code=True)
        block = view.next_code_block() if view else None
        if block is None:
            self._notify("No code block to copy.", severity="warning")
            return
        code, i, n = block
        self._copy_to_clipboard(code)
        self._notify(f"Copied code block {i}/{n}.", timeout=2)
