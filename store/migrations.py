"""Schema: `PRAGMA user_version` migrations, one upgrade step per version, plus the optional
full-text index.

How to change the schema: append a function to `MIGRATIONS` that takes the database from the
previous version to the next (never edit a released step). `migrate` runs the missing steps in
one write transaction, so a database is always at a whole version, and a database from a newer
velo-chat is refused instead of being written with a schema we do not know.

The FTS5 index is not a versioned step, because whether it can exist depends on the SQLite build
that opens the file, not on the file. `ensure_search_index` keeps it in step on every open: with
FTS5 it makes sure the table and its sync triggers exist (rebuilding the index when the triggers
were missing, since rows written meanwhile are not indexed); without FTS5 (or when forced off) it
drops the triggers, because a trigger that writes to an fts5 table fails every insert on a build
that lacks the module. Search then falls back to LIKE.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from .errors import IncompatibleStore
from .reasoning import INLINE_OPEN, split_inline

log = logging.getLogger(__name__)

FTS_TABLE: Final = "messages_fts"
_FTS_TRIGGERS: Final = ("messages_fts_ai", "messages_fts_ad", "messages_fts_au")


def _v1_initial(conn: sqlite3.Connection) -> None:
    """Sessions and their messages."""
    conn.execute(
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            title TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            profile TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            model_fingerprint TEXT,
            parent_session_id TEXT REFERENCES sessions(id) ON DELETE SET NULL,
            forked_from_message_id INTEGER
        )
        """
    )
    conn.execute("CREATE INDEX sessions_updated ON sessions(updated_at DESC)")
    conn.execute("CREATE INDEX sessions_parent ON sessions(parent_session_id)")
    conn.execute(
        """
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('complete', 'interrupted', 'error')),
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            stats TEXT NOT NULL DEFAULT '{}',
            created_at REAL NOT NULL,
            UNIQUE (session_id, position)
        )
        """
    )


def _v2_reasoning(conn: sqlite3.Connection) -> None:
    """A reply's reasoning in its own column, apart from the answer. Replies stored before kept
    it inline, as a `<think>...</think>` block at the start of the content: it is moved out
    (`reasoning.split_inline`), so every reply reads the same way whatever its age."""
    conn.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''")
    rows = conn.execute(
        "SELECT id, content FROM messages WHERE role = 'assistant' AND instr(content, ?) > 0",
        (INLINE_OPEN,),
    ).fetchall()
    for message_id, content in rows:
        thinking, answer = split_inline(content)
        if thinking is not None:
            conn.execute(
                "UPDATE messages SET content = ?, reasoning = ? WHERE id = ?", (answer, thinking, message_id)
            )


def _v3_attachments(conn: sqlite3.Connection) -> None:
    """Files attached to user messages, in their own table so the typed text stays the message's
    content; messages typed while a reply streamed (drafts), stored at once so a quit loses none;
    and the folder a session was started in, which attachments' relative paths are relative to.
    A draft's attachments are a JSON list: a draft is replaced whole, never queried by file."""
    conn.execute("ALTER TABLE sessions ADD COLUMN working_dir TEXT")
    conn.execute(
        """
        CREATE TABLE attachments (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            ordinal INTEGER NOT NULL,
            path TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            size INTEGER NOT NULL,
            content TEXT NOT NULL,
            UNIQUE (message_id, ordinal)
        )
        """
    )
    conn.execute("CREATE INDEX attachments_message ON attachments(message_id)")
    conn.execute(
        """
        CREATE TABLE drafts (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            text TEXT NOT NULL,
            attachments TEXT NOT NULL DEFAULT '[]',
            created_at REAL NOT NULL
        )
        """
    )
    conn.execute("CREATE INDEX drafts_session ON drafts(session_id)")


def _v4_compaction(conn: sqlite3.Connection) -> None:
    """What a full context leaves behind (docs/compaction.md): a session that continues its
    parent after a compaction (`continues`: the sidebar labels it, its parent stays whole), the
    first message the model still sees after the oldest turns left its view (`view_start`: the
    messages before it stay stored and shown), and files the user pinned, which every
    compaction and every dropped view carries on (`attachments.pinned`)."""
    conn.execute("ALTER TABLE sessions ADD COLUMN continues INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE sessions ADD COLUMN view_start INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE attachments ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")


def _v5_tools(conn: sqlite3.Connection) -> None:
    """Tool steps and undo without git (docs/coding-sessions.md, "Undo").

    A reply's tool calls are a JSON list on its message (read and written whole, with the
    reply); what came of each call is a row of `tool_results`, one per call, since results
    arrive one at a time and are searched. A file's bytes before and after a tool changed it
    are content-addressed `file_blobs` (a file edited ten times in a session is stored as its
    versions, each once), which `undo_records` name by sha256. The records go with their
    session and their message (cascade); a blob goes when the last record naming it does
    (`undo_records_blobs_ad`), so deleting a session or regenerating a reply leaves no bytes
    nothing can reach. JSON and BLOBs only: nothing here is pickled."""
    conn.execute("ALTER TABLE messages ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '[]'")
    conn.execute(
        """
        CREATE TABLE tool_results (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            call_index INTEGER NOT NULL CHECK (call_index >= 0),
            call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            decision TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT '',
            content TEXT NOT NULL,
            ok INTEGER NOT NULL,
            details TEXT NOT NULL DEFAULT '{}',
            created_at REAL NOT NULL,
            UNIQUE (message_id, call_index)
        )
        """
    )
    conn.execute("CREATE TABLE file_blobs (sha256 TEXT PRIMARY KEY, data BLOB NOT NULL)")
    conn.execute(
        """
        CREATE TABLE undo_records (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            call_index INTEGER NOT NULL CHECK (call_index >= 0),
            path TEXT NOT NULL,
            before_sha256 TEXT REFERENCES file_blobs(sha256),
            after_sha256 TEXT REFERENCES file_blobs(sha256),
            created_at REAL NOT NULL,
            undone_at REAL
        )
        """
    )
    conn.execute("CREATE INDEX undo_records_session ON undo_records(session_id, id)")
    conn.execute("CREATE INDEX undo_records_message ON undo_records(message_id)")
    # the blob trigger's lookups (and the foreign keys' checks) by either hash
    conn.execute("CREATE INDEX undo_records_before ON undo_records(before_sha256)")
    conn.execute("CREATE INDEX undo_records_after ON undo_records(after_sha256)")
    conn.execute(
        """CREATE TRIGGER undo_records_blobs_ad AFTER DELETE ON undo_records BEGIN
            DELETE FROM file_blobs WHERE sha256 IN (old.before_sha256, old.after_sha256)
            AND NOT EXISTS (SELECT 1 FROM undo_records u
                            WHERE u.before_sha256 = file_blobs.sha256
                               OR u.after_sha256 = file_blobs.sha256); END"""
    )


MIGRATIONS: Final[tuple[Callable[[sqlite3.Connection], None], ...]] = (
    _v1_initial,
    _v2_reasoning,
    _v3_attachments,
    _v4_compaction,
    _v5_tools,
)
"""Step i takes the database from version i to version i + 1."""

LATEST_VERSION: Final = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the database to `LATEST_VERSION`. The connection must be in autocommit mode.

    Takes the write lock only when a step is due, and re-reads the version under it, so two
    processes opening a new database at once do not both run the steps.
    """
    if schema_version(conn) == LATEST_VERSION:
        return
    with write_transaction(conn):
        version = schema_version(conn)
        if version > LATEST_VERSION:
            raise IncompatibleStore(
                f"session database schema version {version} is newer than this velo-chat "
                f"understands ({LATEST_VERSION}); upgrade velo-chat"
            )
        for step in range(version, LATEST_VERSION):
            log.info("session store: migrating schema %d -> %d", step, step + 1)
            MIGRATIONS[step](conn)
            conn.execute(f"PRAGMA user_version = {step + 1}")


def fts5_available(conn: sqlite3.Connection) -> bool:
    """Whether this SQLite build has the FTS5 module (asked, not guessed from the version)."""
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.velo_fts5_probe USING fts5(x)")
    except sqlite3.OperationalError:
        return False
    conn.execute("DROP TABLE temp.velo_fts5_probe")
    return True


def _names(conn: sqlite3.Connection, kind: str, names: tuple[str, ...]) -> set[str]:
    marks = ",".join("?" * len(names))
    rows = conn.execute(
        f"SELECT name FROM sqlite_master WHERE type = ? AND name IN ({marks})", (kind, *names)
    )
    return {row[0] for row in rows}


def ensure_search_index(conn: sqlite3.Connection, use_fts: bool) -> None:
    """Create (use_fts) or disconnect (not use_fts) the FTS5 index; see the module docstring.

    Writes only when something has to change, so a normal open takes no write lock.
    """
    if not use_fts:
        if _names(conn, "trigger", _FTS_TRIGGERS):
            log.warning("session store: FTS5 not used, search uses LIKE; unhooking the index")
            with write_transaction(conn):
                for name in _names(conn, "trigger", _FTS_TRIGGERS):
                    conn.execute(f"DROP TRIGGER {name}")
        return
    if _names(conn, "trigger", _FTS_TRIGGERS) == set(_FTS_TRIGGERS):
        return
    with write_transaction(conn):
        if not _names(conn, "table", (FTS_TABLE,)):
            conn.execute(
                f"CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5(content, content='messages', "
                "content_rowid='id', tokenize='unicode61 remove_diacritics 2')"
            )
        for name in _names(conn, "trigger", _FTS_TRIGGERS):
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute(
            f"""CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN
                INSERT INTO {FTS_TABLE}(rowid, content) VALUES (new.id, new.content); END"""
        )
        conn.execute(
            f"""CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN
                INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, content)
                VALUES ('delete', old.id, old.content); END"""
        )
        conn.execute(
            f"""CREATE TRIGGER messages_fts_au AFTER UPDATE OF content ON messages BEGIN
                INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, content)
                VALUES ('delete', old.id, old.content);
                INSERT INTO {FTS_TABLE}(rowid, content) VALUES (new.id, new.content); END"""
        )
        # Rows written while the triggers were missing are not in the index: rebuild it from
        # the messages table (external-content FTS reads that table directly).
        conn.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('rebuild')")
    log.info("session store: full-text index ready")


@contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """`BEGIN IMMEDIATE` ... `COMMIT`, or `ROLLBACK` on any error (autocommit connection).

    IMMEDIATE takes the write lock up front, where the busy timeout applies; a deferred
    transaction that upgrades from read to write in WAL mode can fail at once with SQLITE_BUSY
    instead of waiting.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
