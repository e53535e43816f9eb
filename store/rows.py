"""Row-level helpers shared by the repository and search: column lists, row <-> model, and the
checks on values the caller passes in. Every function here runs inside the caller's transaction.

Every text a caller passes goes through `text` (via the checks below) before it is bound:
`sqlite3` cannot encode a lone surrogate and would raise `UnicodeEncodeError`, so they become
U+FFFD here, and the models the store returns hold the same text as the rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from .errors import InvalidArgument, MessageNotFound, SessionNotFound
from .input_text import replace_surrogates
from .models import Message, Session

SESSION_COLUMNS = (
    "id, title, created_at, updated_at, profile, system_prompt, model_fingerprint, "
    "parent_session_id, forked_from_message_id"
)
MESSAGE_FIELDS = (
    "id", "session_id", "position", "role", "content", "status",
    "prompt_tokens", "completion_tokens", "stats", "created_at", "reasoning",
)  # fmt: skip
MESSAGE_COLUMNS = ", ".join(f"m.{name}" for name in MESSAGE_FIELDS)
COPY_FIELDS = ", ".join(MESSAGE_FIELDS[3:])
"""The columns a fork copies as they are (all but id, session_id and position)."""


def text(value: str) -> str:
    """A caller's text as the database can hold it (lone surrogates -> U+FFFD)."""
    return replace_surrogates(value)


def optional_text(value: str | None) -> str | None:
    return None if value is None else text(value)


def session(conn: sqlite3.Connection, session_id: str) -> Session:
    row = conn.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?", (text(session_id),)).fetchone()
    if row is None:
        raise SessionNotFound(f"no session {session_id!r}")
    return Session(**dict(row))


def message(conn: sqlite3.Connection, message_id: int | None) -> Message:
    row = conn.execute(f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.id = ?", (message_id,)).fetchone()
    if row is None:
        raise MessageNotFound(f"no message {message_id!r}")
    return message_from_row(row)


def messages(conn: sqlite3.Connection, session_id: str) -> list[Message]:
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.session_id = ? ORDER BY m.position",
        (session_id,),
    )
    return [message_from_row(row) for row in rows]


def message_from_row(row: sqlite3.Row) -> Message:
    fields = {name: row[name] for name in MESSAGE_FIELDS}
    fields["stats"] = json.loads(fields["stats"])
    return Message(**fields)


def insert_session(conn: sqlite3.Connection, s: Session) -> None:
    conn.execute(
        f"INSERT INTO sessions ({SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (s.id, s.title, s.created_at, s.updated_at, s.profile, s.system_prompt,
         s.model_fingerprint, s.parent_session_id, s.forked_from_message_id),
    )  # fmt: skip


def insert_message(
    conn: sqlite3.Connection,
    session_id: str,
    position: int,
    role: str,
    content: str,
    status: str,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    stats: str,
    created_at: float,
    reasoning: str = "",
) -> int:
    """Insert one message row (`stats` already JSON); returns its id."""
    cursor = conn.execute(
        "INSERT INTO messages (session_id, position, role, content, status, prompt_tokens,"
        " completion_tokens, stats, created_at, reasoning) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (session_id, position, role, content, status, prompt_tokens, completion_tokens, stats,
         created_at, reasoning),
    )  # fmt: skip
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def update_row(conn: sqlite3.Connection, table: str, row_id: object, changes: dict[str, Any]) -> None:
    """`UPDATE table SET k = ? ... WHERE id = ?`; the keys are column names chosen by the store,
    never by the caller, so building the statement from them is safe."""
    assignments = ", ".join(f"{name} = ?" for name in changes)
    conn.execute(f"UPDATE {table} SET {assignments} WHERE id = ?", (*changes.values(), row_id))


def require_text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{name} must be a non-empty string (got {value!r})")
    return text(value)


def clean_title(title: str) -> str:
    return " ".join(require_text(title, "a session title").split())


def check_content(content: object, what: str = "message content") -> str:
    if not isinstance(content, str):
        raise InvalidArgument(f"{what} must be text (got {type(content).__name__})")
    return text(content)


def check_choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise InvalidArgument(f"{name} must be one of {', '.join(allowed)} (got {value!r})")
    return value


def check_count(value: int | None, name: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise InvalidArgument(f"{name} must be a non-negative integer or None (got {value!r})")
    return value


def stats_json(stats: Mapping[str, Any] | None) -> str:
    """Stats as JSON. Lenient on values (str() of anything JSON lacks) so that an odd stat from
    the engine can never cost the message it belongs to."""
    if stats is None:
        return "{}"
    if not isinstance(stats, Mapping):
        raise InvalidArgument(f"stats must be a mapping (got {type(stats).__name__})")
    return text(json.dumps(dict(stats), ensure_ascii=False, sort_keys=True, default=str))
