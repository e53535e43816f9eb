"""`SessionStore`: the repository API over the session database.

Concurrency: one connection per store, opened with `check_same_thread=False` and guarded by a
re-entrant lock, so the TUI's main thread and its generation worker can share one store. Each call
is a few milliseconds of SQLite work, so serialising them costs nothing visible; a connection per
thread would make the app's own threads contend for SQLite's file lock (and surface as
`StoreLocked` inside one process) and leave connections to close on threads that may be gone.

Other processes (a second velo-chat, `velo-chat ask` while the TUI runs) are handled by SQLite:
WAL lets them read while one writes, every write starts with `BEGIN IMMEDIATE` so it waits up to
`busy_timeout_s` for the write lock, and past that the call raises `StoreLocked` having written
nothing. `synchronous=FULL`: a committed message survives a power cut, not only a crash; the app
should therefore throttle streaming `update_message` calls (e.g. once a second).

Streaming replies without losing anything: `add_message(s, "user", text)` commits the user's
message first; `add_message(s, "assistant", "", status="interrupted")` makes the reply row; the
worker updates its content as it goes and finally sets `status="complete"` with the stats. A crash
or kill at any point leaves the user's message and the partial reply, marked interrupted.

One writer per session: `with store.writer(session_id):` around a whole turn keeps two processes
(or two threads) from interleaving their turns in one session; `session_lock.py` says why and how.

Attachments and drafts: a user message's files are rows of their own (`attachments`), written in
the transaction of their message and read with it; messages typed while a reply streams are
stored at once as drafts (`add_draft`), so quitting with a queue loses none of them. History is
never rewritten: a revision of an earlier message is a fork (`fork_before`) plus a new turn, a
compaction a continuation (`create_continuation`), and dropping the oldest turns from the
model's view only moves `view_start` (docs/compaction.md).

Privacy: the database and its -wal/-shm files are 0600 whatever the umask, and an older one left
0644 is tightened when opened (`private_file.py`).

Text: every string written goes through `rows.text` first, so a lone surrogate (from argv, a JSON
escape, a paste) becomes U+FFFD instead of a `UnicodeEncodeError` out of `sqlite3`
(`input_text.py` has the whole input policy).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import exchange, rows, session_lock, tool_rows
from .errors import (
    AmbiguousId,
    InvalidArgument,
    MessageNotFound,
    SessionNotFound,
    StoreError,
    StoreReadOnly,
    translate,
)
from .migrations import ensure_search_index, fts5_available, migrate, write_transaction
from .models import (
    ROLES,
    STATUSES,
    Attachment,
    Draft,
    Message,
    NewMessage,
    SearchHit,
    Session,
    StoredToolCall,
    ToolResult,
    UndoRecord,
    make_title,
)
from .private_file import private_database_file
from .search import find

log = logging.getLogger(__name__)


class SessionStore:
    """Sessions and messages in one SQLite file. Use as a context manager, or call `close`.

    `use_fts`: None (or True) uses FTS5 when this SQLite build has it; False forces the LIKE
    search path (tests, odd builds).
    `clock`: returns Unix seconds; injectable so tests get deterministic times and order.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        busy_timeout_s: float = 5.0,
        use_fts: bool | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._clock = clock
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        try:  # the app's data dir already exists (engine.locations, 0700); tests pass others
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreReadOnly(
                f"cannot create the directory of the session database {self.path}: {exc.strerror}"
            ) from exc
        try:
            private_database_file(self.path)
        except OSError as exc:
            raise StoreReadOnly(f"cannot create the session database {self.path}: {exc.strerror}") from exc
        try:
            conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise translate(exc, self.path, busy_timeout_s) from exc
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys = ON")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("session store: journal mode is %s, not WAL", mode)
            conn.execute("PRAGMA synchronous = FULL")
            migrate(conn)
            self.uses_fts = use_fts is not False and fts5_available(conn)
            ensure_search_index(conn, self.uses_fts)
        except sqlite3.Error as exc:
            conn.close()
            raise translate(exc, self.path, busy_timeout_s) from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        log.debug("session store open: %s (fts=%s)", self.path, self.uses_fts)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent). Later calls raise `StoreError`."""
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.execute("PRAGMA optimize")
            except sqlite3.Error:
                log.debug("session store: PRAGMA optimize failed", exc_info=True)
            self._conn.close()
            self._conn = None

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """One locked transaction; sqlite3 errors leave as `StoreError`s, rolled back."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError(f"session store {self.path} is closed")
            try:
                if write:
                    with write_transaction(conn):
                        yield conn
                else:
                    conn.execute("BEGIN")
                    try:
                        yield conn
                    finally:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise translate(exc, self.path, self._busy_timeout_s) from exc

    # -- sessions ---------------------------------------------------------------------------

    def create_session(
        self,
        profile: str,
        system_prompt: str = "",
        title: str | None = None,
        model_fingerprint: str | None = None,
        working_dir: str | None = None,
    ) -> Session:
        """A new, empty session. `working_dir`: the folder velo-chat was started in, which the
        attachments' relative paths are relative to (None: not known, e.g. an import of old)."""
        profile = rows.require_text(profile, "profile")
        folder = rows.require_text(working_dir, "working_dir") if working_dir is not None else None
        now = self._clock()
        session = Session(
            id=uuid.uuid4().hex,
            title=rows.clean_title(title) if title is not None else None,
            created_at=now,
            updated_at=now,
            profile=profile,
            system_prompt=rows.text(system_prompt),
            model_fingerprint=rows.optional_text(model_fingerprint),
            working_dir=folder,
        )
        with self._transaction(write=True) as conn:
            rows.insert_session(conn, session)
        return session

    def get_session(self, session_id: str) -> Session:
        with self._transaction() as conn:
            return rows.session(conn, session_id)

    def list_sessions(self, limit: int | None = None) -> list[Session]:
        """Most recently updated first."""
        with self._transaction() as conn:
            found = conn.execute(
                f"SELECT {rows.SESSION_COLUMNS} FROM sessions ORDER BY updated_at DESC, rowid DESC LIMIT ?",
                (-1 if limit is None else limit,),
            ).fetchall()
        return [rows.session_from_row(row) for row in found]

    def rename(self, session_id: str, title: str) -> Session:
        """Set the title (one line, whitespace collapsed). Does not change `updated_at`, so the
        session list keeps its order."""
        clean = rows.clean_title(title)
        with self._transaction(write=True) as conn:
            rows.session(conn, session_id)
            conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (clean, session_id))
            return rows.session(conn, session_id)

    def update_session(
        self,
        session_id: str,
        *,
        profile: str | None = None,
        system_prompt: str | None = None,
        model_fingerprint: str | None = None,
    ) -> Session:
        """Change the session's settings; arguments left None keep their value."""
        changes: dict[str, Any] = {
            "system_prompt": rows.optional_text(system_prompt),
            "model_fingerprint": rows.optional_text(model_fingerprint),
        }
        if profile is not None:
            changes["profile"] = rows.require_text(profile, "profile")
        changes = {k: v for k, v in changes.items() if v is not None}
        with self._transaction(write=True) as conn:
            rows.session(conn, session_id)
            if changes:
                rows.update_row(conn, "sessions", session_id, changes)
            return rows.session(conn, session_id)

    def delete(self, session_id: str) -> None:
        """Delete the session and (by cascade) its messages, attachments, drafts, tool results
        and undo records, and the file versions nothing names any more; its forks keep their
        copies. Its writer lock file goes too."""
        with self._transaction(write=True) as conn:
            if conn.execute("DELETE FROM sessions WHERE id = ?", (rows.text(session_id),)).rowcount == 0:
                raise SessionNotFound(f"no session {session_id!r}")
            tool_rows.drop_unreferenced_blobs(conn)
        try:
            path = session_lock.lock_path(self.path, session_id)
        except InvalidArgument:  # an id no lock file can have (an imported oddity)
            return
        session_lock.remove(path)

    # -- one writer per session -------------------------------------------------------------

    @contextmanager
    def writer(
        self,
        session_id: str,
        *,
        on_wait: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        poll_s: float = 0.05,
    ) -> Iterator[None]:
        """Be the only writer of `session_id` for the body, across processes and threads.

        If another holds it, `on_wait` is called once with who ("process 1234", "another
        process"), then the lock is polled every `poll_s` until it is free, or until `cancel` is
        set: `SessionBusy` then, and nothing was written. The lock goes with the body's end, or
        with the process (kill -9 included). Takes no database lock: reads and other sessions'
        writes go on meanwhile. See `session_lock.py` for why."""
        path = session_lock.lock_path(self.path, session_id)
        with session_lock.hold(path, session_id, on_wait=on_wait, cancel=cancel, poll_s=poll_s):
            yield

    def resolve_id(self, prefix: str) -> str:
        """The full id of the one session whose id starts with `prefix` (for the CLI)."""
        wanted = rows.text(prefix).strip().lower()
        if not wanted:
            raise InvalidArgument("a session id (or a prefix of one) is required")
        with self._transaction() as conn:
            found = conn.execute(
                "SELECT id FROM sessions WHERE substr(id, 1, ?) = ? ORDER BY updated_at DESC",
                (len(wanted), wanted),
            ).fetchall()
        ids = [row[0] for row in found]
        if wanted in ids or len(ids) == 1:
            return wanted if wanted in ids else ids[0]
        if not ids:
            raise SessionNotFound(f"no session id starts with {prefix.strip()!r}")
        shown = ", ".join(i[:12] for i in ids[:5]) + (", ..." if len(ids) > 5 else "")
        raise AmbiguousId(
            f"session id prefix {prefix.strip()!r} matches {len(ids)} sessions ({shown}); "
            "give more characters"
        )

    # -- messages ---------------------------------------------------------------------------

    def add_message(
        self,
        session_id: str,
        role: str,
        content: str,
        status: str = "complete",
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        stats: Mapping[str, Any] | None = None,
        reasoning: str = "",
        attachments: Sequence[Attachment] = (),
    ) -> Message:
        """Append a message; bumps `updated_at` and, for the first user message of an untitled
        session, sets the title from it (`make_title`). `reasoning`: a reply's reasoning, kept
        apart from its answer (`content`). `attachments`: files sent with it, written in the same
        transaction (all checked first: a bad one raises `InvalidArgument`, nothing written)."""
        files = rows.check_attachments(attachments)
        rows.check_choice(role, ROLES, "role")
        rows.check_choice(status, STATUSES, "status")
        rows.check_count(prompt_tokens, "prompt_tokens")
        rows.check_count(completion_tokens, "completion_tokens")
        content = rows.check_content(content)
        reasoning = rows.check_content(reasoning, "reasoning")
        stats_json = rows.stats_json(stats)
        with self._transaction(write=True) as conn:
            return self._append(
                conn,
                session_id,
                role,
                content,
                status,
                prompt_tokens,
                completion_tokens,
                stats_json,
                reasoning,
                files,
            )

    def add_exchange(
        self,
        session_id: str,
        user_text: str,
        *,
        attachments: Sequence[Attachment] = (),
        replace_after: int | None = None,
    ) -> tuple[Message, Message]:
        """Start a turn in one transaction: the user's message (with its attachments) and an
        empty assistant reply marked "interrupted" (streaming fills it in). With `replace_after`,
        the messages after that position are deleted first (regenerate, edit-last-message; -1
        clears all).

        All or nothing: a failure leaves the session exactly as it was, so the caller can give
        the text back to the user instead of leaving half a turn behind."""
        content = rows.check_content(user_text)
        files = rows.check_attachments(attachments)
        with self._transaction(write=True) as conn:
            if replace_after is not None:
                rows.session(conn, session_id)
                conn.execute(
                    "DELETE FROM messages WHERE session_id = ? AND position > ?", (session_id, replace_after)
                )
            no_stats = rows.stats_json(None)
            user = self._append(
                conn, session_id, "user", content, "complete", None, None, no_stats, "", files
            )
            reply = self._append(conn, session_id, "assistant", "", "interrupted", None, None, no_stats)
            return user, reply

    def _append(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        role: str,
        content: str,
        status: str,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        stats_json: str,
        reasoning: str = "",
        attachments: Sequence[Attachment] = (),
    ) -> Message:
        now = self._clock()  # read under the lock: positions and times agree in order
        session = rows.session(conn, session_id)
        position = conn.execute(
            "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE session_id = ?",
            (session_id,),
        ).fetchone()[0]
        message_id = rows.insert_message(
            conn, session_id, position, role, content, status, prompt_tokens,
            completion_tokens, stats_json, now, reasoning,
        )  # fmt: skip
        rows.insert_attachments(conn, message_id, attachments)
        title = session.title
        if title is None and role == "user":
            title = make_title(content)
        conn.execute(
            "UPDATE sessions SET updated_at = ?, title = ? WHERE id = ?",
            (now, title, session_id),
        )
        return rows.message(conn, message_id)

    def update_message(
        self,
        message_id: int,
        *,
        content: str | None = None,
        status: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        stats: Mapping[str, Any] | None = None,
        reasoning: str | None = None,
    ) -> Message:
        """Change a message in place (a streaming reply); arguments left None keep their value.
        Bumps the session's `updated_at`."""
        changes: dict[str, Any] = {}
        if content is not None:
            changes["content"] = rows.check_content(content)
        if reasoning is not None:
            changes["reasoning"] = rows.check_content(reasoning, "reasoning")
        if status is not None:
            changes["status"] = rows.check_choice(status, STATUSES, "status")
        if prompt_tokens is not None:
            changes["prompt_tokens"] = rows.check_count(prompt_tokens, "prompt_tokens")
        if completion_tokens is not None:
            changes["completion_tokens"] = rows.check_count(completion_tokens, "completion_tokens")
        if stats is not None:
            changes["stats"] = rows.stats_json(stats)
        with self._transaction(write=True) as conn:
            message = rows.message(conn, message_id)
            if changes:
                rows.update_row(conn, "messages", message_id, changes)
                conn.execute(
                    "UPDATE sessions SET updated_at = ? WHERE id = ?",
                    (self._clock(), message.session_id),
                )
            return rows.message(conn, message_id)

    def get_message(self, message_id: int) -> Message:
        with self._transaction() as conn:
            return rows.message(conn, message_id)

    def messages(self, session_id: str) -> list[Message]:
        """The session's messages in order (raises `SessionNotFound` for an unknown id)."""
        with self._transaction() as conn:
            rows.session(conn, session_id)
            return rows.messages(conn, session_id)

    # -- search -----------------------------------------------------------------------------

    def search(self, query: str, *, session_id: str | None = None, limit: int = 50) -> list[SearchHit]:
        """Messages containing every word of `query`, best first (FTS5 rank, or most recent
        session first on the LIKE path). An empty query finds nothing."""
        if not query.strip():
            return []
        query, session_id = rows.text(query), rows.optional_text(session_id)
        with self._transaction() as conn:
            found = find(conn, query, self.uses_fts, session_id, limit)
            sessions: dict[str, Session] = {}
            for message, _ in found:
                if message.session_id not in sessions:
                    sessions[message.session_id] = rows.session(conn, message.session_id)
        return [SearchHit(sessions[m.session_id], m, snippet) for m, snippet in found]

    # -- forks ------------------------------------------------------------------------------

    def fork(self, session_id: str, at_message_id: int, title: str | None = None) -> Session:
        """A new session with copies of the messages up to and including `at_message_id` (and
        their attachments, tool calls and results; not the undo records, which stay with the
        session whose call changed the file).

        The copies are independent rows (editing either session never touches the other); the
        engine's checkpoints are keyed on token prefixes, so the fork reuses the parent's."""
        with self._transaction(write=True) as conn:
            rows.session(conn, session_id)
            at = rows.message(conn, at_message_id)
            if at.session_id != session_id:
                raise MessageNotFound(f"message {at_message_id} is not in session {session_id!r}")
            return self._fork(conn, session_id, at.position + 1, at.id, title)

    def fork_before(self, session_id: str, position: int, title: str | None = None) -> Session:
        """A new session holding copies of the messages before `position` (and their
        attachments): how "revise message N" and "regenerate reply N" work without rewriting
        history. The caller then adds the new turn to the fork; the original never changes.

        `position` must be that of a message of the session (else `MessageNotFound`); 0 gives an
        empty fork (`forked_from_message_id` None) with the session's settings."""
        if not isinstance(position, int) or isinstance(position, bool):
            raise InvalidArgument(f"position must be an integer (got {position!r})")
        with self._transaction(write=True) as conn:
            rows.session(conn, session_id)
            target = conn.execute(
                "SELECT id FROM messages WHERE session_id = ? AND position = ?", (session_id, position)
            ).fetchone()
            if target is None:
                raise MessageNotFound(f"session {session_id!r} has no message at position {position}")
            before = conn.execute(
                "SELECT id FROM messages WHERE session_id = ? AND position < ? "
                "ORDER BY position DESC LIMIT 1",
                (session_id, position),
            ).fetchone()
            return self._fork(conn, session_id, position, before[0] if before else None, title)

    def _fork(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        below: int,
        forked_from: int | None,
        title: str | None,
    ) -> Session:
        """Copy the messages at positions < `below` (and their attachments) into a new child."""
        parent = rows.session(conn, session_id)
        if title is None:
            base = parent.title or self._first_title(conn, session_id, below)
            title = f"{base} (fork)" if base else None
        child = self._child_of(
            parent,
            title,
            forked_from,
            # the fork shows the model what the session showed it (when that view is in the copy)
            view_start=parent.view_start if parent.view_start < below else 0,
        )
        rows.insert_session(conn, child)
        conn.execute(
            f"INSERT INTO messages (session_id, position, {rows.COPY_FIELDS}) "
            f"SELECT ?, position, {rows.COPY_FIELDS} FROM messages "
            "WHERE session_id = ? AND position < ? ORDER BY position",
            (child.id, session_id, below),
        )
        rows.copy_attachments(conn, session_id, child.id, below)
        tool_rows.copy_tool_results(conn, session_id, child.id, below)
        return child

    # -- compaction ---------------------------------------------------------------------------

    def create_continuation(
        self, parent_id: str, messages: Sequence[NewMessage], title: str | None = None
    ) -> Session:
        """A new session continuing `parent_id` after a compaction, holding `messages` (the
        summary request and the summary, then the last turns copied), in one transaction: all
        of it is written or none (`InvalidArgument` for a bad message, before anything is).

        It takes the parent's profile, system prompt, model fingerprint and working folder, is
        linked to it (`parent_session_id`, `continues`, `forked_from_message_id`: the parent's
        last message) and is titled "<parent title> (continued)". The parent is not changed."""
        checked = [self._check_new(m, f"messages[{i}]") for i, m in enumerate(messages)]
        with self._transaction(write=True) as conn:
            parent = rows.session(conn, parent_id)
            last = conn.execute(
                "SELECT id FROM messages WHERE session_id = ? ORDER BY position DESC LIMIT 1", (parent.id,)
            ).fetchone()
            if title is None:
                base = parent.title or self._first_title(conn, parent.id)
                title = f"{base} (continued)" if base else None
            child = self._child_of(parent, title, last[0] if last else None, continues=True)
            rows.insert_session(conn, child)
            for position, m in enumerate(checked):
                message_id = rows.insert_message(
                    conn, child.id, position, m.role, m.content, m.status, m.prompt_tokens,
                    m.completion_tokens, rows.stats_json(m.stats), child.created_at, m.reasoning,
                )  # fmt: skip
                rows.insert_attachments(conn, message_id, m.attachments)
            return child

    @staticmethod
    def _check_new(m: object, where: str) -> NewMessage:
        """A `NewMessage` with every field checked as `add_message` checks its arguments."""
        if not isinstance(m, NewMessage):
            raise InvalidArgument(f"{where} must be a NewMessage (got {type(m).__name__})")
        rows.check_choice(m.role, ROLES, f"{where}.role")
        rows.check_choice(m.status, STATUSES, f"{where}.status")
        rows.check_count(m.prompt_tokens, f"{where}.prompt_tokens")
        rows.check_count(m.completion_tokens, f"{where}.completion_tokens")
        rows.stats_json(m.stats)  # a mapping, or InvalidArgument
        return NewMessage(
            role=m.role,
            content=rows.check_content(m.content, f"{where}.content"),
            reasoning=rows.check_content(m.reasoning, f"{where}.reasoning"),
            attachments=rows.check_attachments(m.attachments),
            status=m.status,
            stats=dict(m.stats),
            prompt_tokens=m.prompt_tokens,
            completion_tokens=m.completion_tokens,
        )

    @staticmethod
    def _first_title(conn: sqlite3.Connection, session_id: str, below: int | None = None) -> str | None:
        """A title from the session's first user message (before position `below`, if given)."""
        first_user = conn.execute(
            "SELECT content FROM messages WHERE session_id = ? AND role = 'user' "
            "AND (? IS NULL OR position < ?) ORDER BY position LIMIT 1",
            (session_id, below, below),
        ).fetchone()
        return make_title(first_user[0]) if first_user else None

    def _child_of(self, parent: Session, title: str | None, forked_from: int | None, **links: Any) -> Session:
        """A new session taken from `parent` (a fork or a continuation): its profile, system
        prompt, model fingerprint and working folder, linked to it; `links` sets the rest
        (`view_start`, `continues`)."""
        now = self._clock()
        return Session(
            id=uuid.uuid4().hex,
            title=rows.clean_title(title) if title is not None else None,
            created_at=now,
            updated_at=now,
            profile=parent.profile,
            system_prompt=parent.system_prompt,
            model_fingerprint=parent.model_fingerprint,
            parent_session_id=parent.id,
            forked_from_message_id=forked_from,
            working_dir=parent.working_dir,
            **links,
        )

    def set_view_start(self, session_id: str, position: int) -> Session:
        """Make `position` the first message the model sees (drop_oldest, docs/compaction.md):
        0, or the position of one of the session's user messages (else `InvalidArgument`). The
        messages before it stay stored; `updated_at` does not change (nothing was said)."""
        if not isinstance(position, int) or isinstance(position, bool) or position < 0:
            raise InvalidArgument(f"view_start must be a non-negative integer (got {position!r})")
        with self._transaction(write=True) as conn:
            rows.session(conn, session_id)
            if position:
                role = conn.execute(
                    "SELECT role FROM messages WHERE session_id = ? AND position = ?", (session_id, position)
                ).fetchone()
                if role is None or role[0] != "user":
                    raise InvalidArgument(
                        f"view_start must be 0 or the position of a user message (got {position})"
                    )
            conn.execute("UPDATE sessions SET view_start = ? WHERE id = ?", (position, session_id))
            return rows.session(conn, session_id)

    # -- tool steps, undo -------------------------------------------------------------------

    def set_tool_calls(self, message_id: int, calls: Sequence[StoredToolCall]) -> Message:
        """Set a reply's tool calls (a step of a tool loop), replacing any it had; bumps the
        session's `updated_at`. `InvalidArgument` for a bad call, a message that is not a reply,
        or one whose dropped call already has a result."""
        calls_json = tool_rows.check_tool_calls(calls)
        with self._transaction(write=True) as conn:
            tool_rows.set_tool_calls(conn, message_id, calls_json, self._clock())
            return rows.message(conn, message_id)

    def add_tool_result(self, message_id: int, result: ToolResult) -> Message:
        """Store what came of call `result.call_index` of a reply (`created_at` 0: now). The
        call must be set, and has one result: `InvalidArgument` for a second."""
        checked = tool_rows.check_tool_result(result)
        with self._transaction(write=True) as conn:
            tool_rows.add_tool_result(conn, message_id, checked, self._clock())
            return rows.message(conn, message_id)

    def put_blob(self, data: bytes) -> str:
        """Store file bytes once; returns their sha256 (lowercase hex). A version no undo
        record names is dropped when a session is deleted: record it (`add_undo_record`)."""
        data = tool_rows.check_bytes(data, "data")
        with self._transaction(write=True) as conn:
            return tool_rows.put_blob(conn, data)

    def blob(self, sha256: str) -> bytes:
        """The bytes stored under `sha256` (`InvalidArgument` when none are)."""
        digest = tool_rows.check_sha256(sha256)
        with self._transaction() as conn:
            return tool_rows.blob(conn, digest)

    def add_undo_record(
        self,
        session_id: str,
        message_id: int,
        call_index: int,
        path: str,
        before: bytes | None,
        after: bytes | None,
    ) -> UndoRecord:
        """Record that call `call_index` of reply `message_id` changed the file `path`
        (absolute) from `before` to `after` (None: it did not exist), both versions and the
        record in one transaction."""
        change = tool_rows.check_change(call_index, path, before, after)
        with self._transaction(write=True) as conn:
            record_id = tool_rows.add_undo_record(
                conn, rows.text(session_id), message_id, *change, self._clock()
            )
            return tool_rows.undo_record(conn, record_id)

    def undo_records(
        self, session_id: str, *, since_position: int | None = None, include_undone: bool = False
    ) -> list[UndoRecord]:
        """The session's undo records in the order they were made (not undone ones, unless
        `include_undone`); `since_position`: those whose message is at that position or later."""
        if since_position is not None:
            tool_rows.check_index(since_position, "since_position")
        with self._transaction() as conn:
            rows.session(conn, session_id)
            return tool_rows.undo_records(conn, session_id, since_position, include_undone)

    def mark_undone(self, record_ids: Sequence[int], when: float | None = None) -> None:
        """Mark records undone (at `when`, default now): their files were put back. All or none:
        `InvalidArgument` for an id that names no record."""
        with self._transaction(write=True) as conn:
            tool_rows.mark_undone(conn, record_ids, self._clock() if when is None else when)

    # -- drafts -----------------------------------------------------------------------------

    def add_draft(self, session_id: str, text: str, attachments: Sequence[Attachment] = ()) -> Draft:
        """Store a message typed while a reply streams, at once, so a quit or a crash loses none.
        Not a message: no position, not searched, and the session's `updated_at` stays."""
        clean = rows.check_content(text, "draft text")
        files = rows.check_attachments(attachments)
        with self._transaction(write=True) as conn:
            rows.session(conn, session_id)
            draft_id = rows.insert_draft(conn, session_id, clean, files, self._clock())
            return rows.draft(conn, draft_id)

    def drafts(self, session_id: str) -> list[Draft]:
        """The session's drafts, oldest first (the order they were queued in)."""
        with self._transaction() as conn:
            rows.session(conn, session_id)
            return rows.drafts(conn, session_id)

    def update_draft(
        self, draft_id: int, text: str, attachments: Sequence[Attachment] | None = None
    ) -> Draft:
        """Replace a draft's text (and its attachments, unless None: kept). `DraftNotFound` when
        it was sent or deleted meanwhile."""
        changes: dict[str, Any] = {"text": rows.check_content(text, "draft text")}
        if attachments is not None:
            changes["attachments"] = rows.attachments_json(rows.check_attachments(attachments))
        with self._transaction(write=True) as conn:
            rows.draft(conn, draft_id)
            rows.update_row(conn, "drafts", draft_id, changes)
            return rows.draft(conn, draft_id)

    def delete_draft(self, draft_id: int) -> None:
        """Drop a draft (sent, or withdrawn by the user). `DraftNotFound` when already gone."""
        with self._transaction(write=True) as conn:
            rows.draft(conn, draft_id)
            conn.execute("DELETE FROM drafts WHERE id = ?", (draft_id,))

    # -- export, import ---------------------------------------------------------------------

    def export_markdown(self, session_id: str) -> str:
        with self._transaction() as conn:
            session, messages = rows.session(conn, session_id), rows.messages(conn, session_id)
            return exchange.export_markdown(session, messages, rows.drafts(conn, session_id))

    def export_json(self, session_id: str) -> dict[str, Any]:
        """The versioned JSON document (`exchange.FORMAT`, `exchange.FORMAT_VERSION`), drafts
        included so an export loses nothing the user typed, and the undo records with the file
        versions they name, so an import can still undo."""
        with self._transaction() as conn:
            session, messages = rows.session(conn, session_id), rows.messages(conn, session_id)
            drafts = rows.drafts(conn, session_id)
            undo = tool_rows.undo_records(conn, session_id, None, include_undone=True)
            versions = tool_rows.blobs(
                conn, (h for r in undo for h in (r.before_sha256, r.after_sha256) if h)
            )
        return exchange.export_json(session, messages, drafts, self._clock(), undo, versions)

    def import_json(self, data: Mapping[str, Any] | str | bytes) -> Session:
        """Import an `export_json` document (parsed or as text) as a new session with a new id,
        with its attachments, working folder and drafts (version 3), where the model's view
        begins and whether it continues another session (version 4; its parent is not linked:
        the import stands alone), and its tool steps and undo records (version 5).
        Raises `InvalidImport` naming the first bad field; nothing is written then."""
        doc = exchange.parse_import(data)
        title = doc.title
        if title is None:
            title = next((make_title(m.content) for m in doc.messages if m.role == "user"), None)
        session = Session(
            id=uuid.uuid4().hex,
            title=rows.clean_title(title) if title and title.strip() else None,
            created_at=doc.created_at,
            updated_at=doc.updated_at,
            profile=doc.profile,
            system_prompt=doc.system_prompt,
            model_fingerprint=doc.model_fingerprint,
            working_dir=doc.working_dir,
            continues=doc.continues,
            view_start=doc.view_start,
        )
        with self._transaction(write=True) as conn:
            rows.insert_session(conn, session)
            ids = []
            for position, m in enumerate(doc.messages):
                message_id = rows.insert_message(
                    conn, session.id, position, m.role, m.content, m.status, m.prompt_tokens,
                    m.completion_tokens, rows.stats_json(m.stats), m.created_at, m.reasoning,
                    tool_rows.check_tool_calls(m.tool_calls),
                )  # fmt: skip
                rows.insert_attachments(conn, message_id, m.attachments)
                for result in m.tool_results:
                    tool_rows.insert_tool_result(conn, message_id, tool_rows.check_tool_result(result))
                ids.append(message_id)
            for u in doc.undo_records:
                before, after = (doc.blobs[h] if h else None for h in (u.before_sha256, u.after_sha256))
                tool_rows.add_undo_record(
                    conn, session.id, ids[u.message_position], u.call_index, u.path, before, after,
                    u.created_at, u.undone_at,
                )  # fmt: skip
            for d in doc.drafts:
                rows.insert_draft(conn, session.id, d.text, d.attachments, d.created_at)
        return session
