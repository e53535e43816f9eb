"""The chat screen's session and copy actions (a mixin, to keep `chat.py` small).

Each action targets the session highlighted in the sidebar when the list has focus, else the
active session; each is bound to a key (`keymap.py`) and offered in the command palette.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from velo_chat.engine.config import locations
from velo_chat.engine.atomic_file import atomic_write_text
from velo_chat.engine.config.profiles import ProfileError, list_profiles, load_profile
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
    from .base import VeloScreen as _Screen
else:
    _Screen = object

log = logging.getLogger(__name__)


class SessionActions(_Screen):
    """Mixed into `ChatScreen`; uses its `session`, `busy`, `app` and widgets. Handlers use
    `on_<message>` names: Textual collects `@on` decorators only from the screen class itself.
    (A plain class at run time; a screen for the type checker.)"""

    if TYPE_CHECKING:  # what ChatScreen provides
        session: Session | None
        busy: bool

        def request_preview(self) -> None: ...
        def _update_header(self) -> None: ...

    _filter = ""

    # -- the list -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def store_guard(self, title: str) -> Iterator[None]:
        """Run store calls; a `StoreError` (locked, full, read-only, damaged database) becomes
        an error dialog with its one-line reason instead of ending the app."""
        try:
            yield
        except StoreError as exc:
            log.warning("%s: %s", title, exc)
            self.app.push_screen(error_dialog(title, str(exc)))

    def refresh_sessions(self) -> None:
        with self.store_guard("Cannot list the sessions"):
            store = self.app.store
            sessions = store.list_sessions()
            q = self._filter.strip().lower()
            if q:  # the store escapes every query, so an error here is a real store problem
                hits = {h.session.id for h in store.search(q)}
                sessions = [s for s in sessions if q in (s.title or "").lower() or s.id in hits]
            active = self.session.id if self.session else None
            self.query_one(SessionSidebar).show(sessions, active)

    def on_session_sidebar_filter_changed(self, event: SessionSidebar.FilterChanged) -> None:
        self._filter = event.query
        self.refresh_sessions()

    async def on_session_sidebar_selected(self, event: SessionSidebar.Selected) -> None:
        await self.open_session(event.session_id)

    async def open_session(self, session_id: str | None) -> None:
        if self.busy:
            self.notify("A reply is streaming: stop it (Esc) before switching.", severity="warning")
            return
        store = self.app.store
        loaded = None
        with self.store_guard("Cannot open the session"):
            loaded = (store.get_session(session_id), store.messages(session_id)) if session_id else (None, [])
        if loaded is None:
            return
        self.session, messages = loaded
        await self.query_one(Transcript).show_messages(messages)
        self.refresh_sessions()
        self._update_header()
        self.query_one(Composer).focus()
        self.request_preview()

    def _target(self) -> Session | None:
        lst = self.query_one(SessionList)
        if lst.has_focus:
            sid = self.query_one(SessionSidebar).highlighted_id()
            if sid:
                with self.store_guard("Cannot read the session"):
                    return self.app.store.get_session(sid)
                return None
        return self.session

    def _need_target(self) -> Session | None:
        target = self._target()
        if target is None:
            self.notify("No session selected.", severity="warning")
        return target

    # -- actions ------------------------------------------------------------------------------

    async def action_new_session(self) -> None:
        await self.open_session(None)

    def action_rename_session(self) -> None:
        target = self._need_target()
        if target is None:
            return

        def done(title: str | None) -> None:
            if title:
                with self.store_guard("Rename failed"):
                    renamed = self.app.store.rename(target.id, title)
                    if self.session and self.session.id == target.id:
                        self.session = renamed
                        self._update_header()
                self.refresh_sessions()

        self.app.push_screen(
            TextPrompt("Rename session", target.title or "", cursor_blink=self.app.cursor_blink), done
        )

    def action_delete_session(self) -> None:
        target = self._need_target()
        if target is None:
            return
        if self.busy and self.session and self.session.id == target.id:
            self.notify("Stop the reply (Esc) before deleting this session.", severity="warning")
            return

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            deleted = False
            with self.store_guard("Delete failed"):
                self.app.store.delete(target.id)
                deleted = True
            if not deleted:
                return
            if self.session and self.session.id == target.id:
                await self.open_session(None)
            self.refresh_sessions()
            self.notify(f"Deleted “{target.title or 'untitled'}”.")

        self.app.push_screen(
            ConfirmDialog(
                "Delete session?",
                f"“{target.title or 'untitled'}” and all its messages will be "
                "deleted. This cannot be undone.",
                yes="Delete",
                no="Keep",
            ),
            done,
        )

    async def action_fork_session(self) -> None:
        target = self._need_target()
        if target is None:
            return
        fork = None
        with self.store_guard("Fork failed"):
            messages = self.app.store.messages(target.id)
            if not messages:
                self.notify("Nothing to fork: the session is empty.", severity="warning")
                return
            fork = self.app.store.fork(target.id, messages[-1].id)
        if fork is None:
            return
        await self.open_session(fork.id)
        self.notify(f"Forked into “{fork.title or 'untitled'}”.")

    def action_export_session(self) -> None:
        target = self._need_target()
        if target is None:
            return
        folder = locations.exports_dir()  # 0700, and the file 0600: it is a whole conversation
        slug = re.sub(r"[^A-Za-z0-9]+", "-", target.title or "untitled").strip("-")[:40]
        path = folder / f"{slug or 'session'}-{target.id[:8]}.md"
        try:
            with self.store_guard("Export failed"):
                atomic_write_text(path, self.app.store.export_markdown(target.id))
        except OSError as exc:
            self.app.push_screen(error_dialog("Export failed", f"{path}: {exc.strerror}"))
            return
        self.notify(f"Exported to {path}", timeout=6)

    def action_switch_profile(self) -> None:
        """Run this session on another profile (explicit: the session remembers it)."""
        if self.busy:
            self.notify("Stop the reply (Esc) first.", severity="warning")
            return
        choices = [(p.name, f"{p.name} [dim]({p.source})[/]") for p in list_profiles()]

        def done(name: str | None) -> None:
            if not name:
                return
            try:
                profile = load_profile(name)
            except ProfileError as exc:
                self.app.push_screen(error_dialog("Profile not usable", str(exc)))
                return
            if self.session is not None:
                with self.store_guard("Cannot change the session's profile"):
                    self.session = self.app.store.update_session(self.session.id, profile=name)
            self.app.use_profile(profile)
            self._update_header()

        self.app.push_screen(
            ChoiceDialog("Switch this session's profile", choices, self.app.profile.name), done
        )

    # -- copying ------------------------------------------------------------------------------

    def _copy_target(self, need_code: bool = False) -> MessageView | None:
        focused = self.focused
        if isinstance(focused, MessageView):
            return focused
        transcript = self.query_one(Transcript)
        views = [v for v in transcript.views() if v.role == "assistant"]
        if need_code:
            views = [v for v in views if code_blocks(v.answer_text())]
        return views[-1] if views else None

    def action_copy_message(self) -> None:
        view = self._copy_target()
        if view is None:
            self.notify("No message to copy.", severity="warning")
            return
        self.app.copy_to_clipboard(view.answer_text())
        self.notify("Copied the message.", timeout=2)

    def action_copy_code(self) -> None:
        view = self._copy_target(need_code=True)
        block = view.next_code_block() if view else None
        if block is None:
            self.notify("No code block to copy.", severity="warning")
            return
        code, i, n = block
        self.app.copy_to_clipboard(code)
        self.notify(f"Copied code block {i}/{n}.", timeout=2)
