"""Row-level helpers shared by the repository and search: column lists, row <-> model, and the
checks on values the caller passes in. Every function here runs inside the caller's transaction.

Every text a caller passes goes through `text` (via the checks below) before it is bound:
`sqlite3` cannot encode a lone surrogate and would raise `UnicodeEncodeError`, so they become
U+FFFD here, and the models the store returns hold the same text as the rows.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from . import tool_rows
from .errors import DraftNotFound, InvalidArgument, MessageNotFound, SessionNotFound
from .input_text import replace_surrogates
from .models import Attachment, Draft, Message, Session, ToolResult

SESSION_COLUMNS = (
    "id, title, created_at, updated_at, profile, system_prompt, model_fingerprint, "
    "parent_session_id, forked_from_message_id, working_dir, continues, view_start"
)
MESSAGE_FIELDS = (
    "id", "session_id", "position", "role", "content", "status",
    "prompt_tokens", "completion_tokens", "stats", "created_at", "reasoning", "tool_calls",
)  # fmt: skip
MESSAGE_COLUMNS = ", ".join(f"m.{name}" for name in MESSAGE_FIELDS)
COPY_FIELDS = ", ".join(MESSAGE_FIELDS[3:])
"""The columns a fork copies as they are (all but id, session_id and position)."""
ATTACHMENT_FIELDS: Final = ("path", "sha256", "size", "content", "pinned")
ATTACHMENT_COLUMNS: Final = ", ".join(f"a.{name}" for name in ATTACHMENT_FIELDS)
DRAFT_COLUMNS: Final = "id, session_id, text, attachments, created_at"
_SHA256_HEX: Final = re.compile(r"[0-9a-fA-F]{64}")
_IDS_PER_QUERY: Final = 500
"""Message ids bound in one `IN (...)`, well under SQLite's limit on bound parameters."""


def text(value: str) -> str:
    """A caller's text as the database can hold it (lone surrogates -> U+FFFD)."""
    return replace_surrogates(value)


def optional_text(value: str | None) -> str | None:
    return None if value is None else text(value)


def session(conn: sqlite3.Connection, session_id: str) -> Session:
    row = conn.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?", (text(session_id),)).fetchone()
    if row is None:
        raise SessionNotFound(f"no session {session_id!r}")
    return session_from_row(row)


def session_from_row(row: sqlite3.Row) -> Session:
    """A `SESSION_COLUMNS` row as a `Session` (SQLite has no booleans: `continues` is 0 or 1)."""
    fields = dict(row)
    fields["continues"] = bool(fields["continues"])
    return Session(**fields)


def message(conn: sqlite3.Connection, message_id: int | None) -> Message:
    row = conn.execute(f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.id = ?", (message_id,)).fetchone()
    if row is None:
        raise MessageNotFound(f"no message {message_id!r}")
    found = conn.execute(
        f"SELECT a.message_id, {ATTACHMENT_COLUMNS} FROM attachments a WHERE a.message_id = ? "
        "ORDER BY a.ordinal",
        (message_id,),
    )
    results = tool_rows.results_of_message(conn, row["id"])
    return message_from_row(row, _group_attachments(found).get(row["id"], ()), results)


def messages(conn: sqlite3.Connection, session_id: str) -> list[Message]:
    """The session's messages in order, with their attachments and tool results: three queries
    whatever the length, so opening a long session costs no more round trips than a short one."""
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.session_id = ? ORDER BY m.position",
        (session_id,),
    ).fetchall()
    found = conn.execute(
        f"SELECT a.message_id, {ATTACHMENT_COLUMNS} FROM attachments a "
        "JOIN messages m ON m.id = a.message_id WHERE m.session_id = ? ORDER BY a.message_id, a.ordinal",
        (session_id,),
    )
    attached = _group_attachments(found)
    results = tool_rows.results_of_session(conn, session_id)
    return [message_from_row(row, attached.get(row["id"], ()), results.get(row["id"], ())) for row in rows]


def with_attachments(conn: sqlite3.Connection, found: Sequence[Message]) -> list[Message]:
    """`found` (messages read without their files, e.g. search hits from several sessions) with
    their attachments, read in a few `IN (...)` queries rather than one per message."""
    ids = sorted({m.id for m in found})
    attached: dict[int, tuple[Attachment, ...]] = {}
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[start : start + _IDS_PER_QUERY]
        marks = ",".join("?" * len(chunk))
        attached.update(
            _group_attachments(
                conn.execute(
                    f"SELECT a.message_id, {ATTACHMENT_COLUMNS} FROM attachments a "
                    f"WHERE a.message_id IN ({marks}) ORDER BY a.message_id, a.ordinal",
                    chunk,
                )
            )
        )
    return [replace(m, attachments=attached.get(m.id, ())) for m in found]


def _group_attachments(found: Iterable[sqlite3.Row]) -> dict[int, tuple[Attachment, ...]]:
    """Rows ordered by (message_id, ordinal) -> each message's attachments in order."""
    grouped: dict[int, list[Attachment]] = {}
    for row in found:
        grouped.setdefault(row["message_id"], []).append(attachment_from(row))
    return {message_id: tuple(items) for message_id, items in grouped.items()}


def attachment_from(item: Mapping[str, Any] | sqlite3.Row) -> Attachment:
    """An attachment row (or a draft's JSON item) as an `Attachment`; an item written before
    files could be pinned has no "pinned" and is not pinned."""
    pinned = item["pinned"] if "pinned" in item.keys() else False
    return Attachment(item["path"], item["sha256"], item["size"], item["content"], bool(pinned))


def message_from_row(
    row: sqlite3.Row, attachments: tuple[Attachment, ...] = (), tool_results: tuple[ToolResult, ...] = ()
) -> Message:
    fields = {name: row[name] for name in MESSAGE_FIELDS}
    fields["stats"] = json.loads(fields["stats"])
    fields["tool_calls"] = tool_rows.tool_calls_from_json(fields["tool_calls"])
    return Message(**fields, attachments=attachments, tool_results=tool_results)


def insert_session(conn: sqlite3.Connection, s: Session) -> None:
    conn.execute(
        f"INSERT INTO sessions ({SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (s.id, s.title, s.created_at, s.updated_at, s.profile, s.system_prompt,
         s.model_fingerprint, s.parent_session_id, s.forked_from_message_id, s.working_dir,
         int(s.continues), s.view_start),
    )  # fmt: skip


def insert_attachments(conn: sqlite3.Connection, message_id: int, attachments: Sequence[Attachment]) -> None:
    """Write a message's (already checked) attachments; `ordinal` is their order."""
    conn.executemany(
        "INSERT INTO attachments (message_id, ordinal, path, sha256, size, content, pinned) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (message_id, i, a.path, a.sha256, a.size, a.content, int(a.pinned))
            for i, a in enumerate(attachments)
        ],
    )


def copy_attachments(conn: sqlite3.Connection, source_id: str, target_id: str, below: int) -> None:
    """Copy the attachments of `source_id`'s messages at positions < `below` to the messages at
    the same positions in `target_id` (a fork, whose copies keep their positions)."""
    conn.execute(
        "INSERT INTO attachments (message_id, ordinal, path, sha256, size, content, pinned) "
        "SELECT copy.id, a.ordinal, a.path, a.sha256, a.size, a.content, a.pinned FROM attachments a "
        "JOIN messages original ON original.id = a.message_id "
        "JOIN messages copy ON copy.session_id = ? AND copy.position = original.position "
        "WHERE original.session_id = ? AND original.position < ? ORDER BY a.message_id, a.ordinal",
        (target_id, source_id, below),
    )


def draft(conn: sqlite3.Connection, draft_id: int) -> Draft:
    row = conn.execute(f"SELECT {DRAFT_COLUMNS} FROM drafts WHERE id = ?", (draft_id,)).fetchone()
    if row is None:
        raise DraftNotFound(f"no queued draft {draft_id!r} (already sent or deleted)")
    return draft_from_row(row)


def drafts(conn: sqlite3.Connection, session_id: str) -> list[Draft]:
    found = conn.execute(
        f"SELECT {DRAFT_COLUMNS} FROM drafts WHERE session_id = ? ORDER BY id", (session_id,)
    )
    return [draft_from_row(row) for row in found]


def draft_from_row(row: sqlite3.Row) -> Draft:
    return Draft(
        id=row["id"],
        session_id=row["session_id"],
        text=row["text"],
        attachments=attachments_from_json(row["attachments"]),
        created_at=row["created_at"],
    )


def insert_draft(
    conn: sqlite3.Connection, session_id: str, text: str, attachments: Sequence[Attachment], created_at: float
) -> int:
    cursor = conn.execute(
        "INSERT INTO drafts (session_id, text, attachments, created_at) VALUES (?, ?, ?, ?)",
        (session_id, text, attachments_json(attachments), created_at),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def attachments_json(attachments: Sequence[Attachment]) -> str:
    """A draft's attachments as the JSON list the drafts table holds (never pickle)."""
    return json.dumps([attachment_dict(a) for a in attachments], ensure_ascii=False)


def attachments_from_json(raw: str) -> tuple[Attachment, ...]:
    return tuple(attachment_from(item) for item in json.loads(raw))


def attachment_dict(a: Attachment) -> dict[str, Any]:
    return {"path": a.path, "sha256": a.sha256, "size": a.size, "content": a.content, "pinned": a.pinned}


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
    tool_calls: str = "[]",
) -> int:
    """Insert one message row (`stats` and `tool_calls` already JSON); returns its id."""
    cursor = conn.execute(
        "INSERT INTO messages (session_id, position, role, content, status, prompt_tokens,"
        " completion_tokens, stats, created_at, reasoning, tool_calls)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (session_id, position, role, content, status, prompt_tokens, completion_tokens, stats,
         created_at, reasoning, tool_calls),
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


def check_attachments(attachments: object) -> tuple[Attachment, ...]:
    """The caller's attachments, checked and with their text made storable; `InvalidArgument`
    naming the first bad one, before anything is written."""
    if isinstance(attachments, (str, bytes)) or not isinstance(attachments, Sequence):
        kind = type(attachments).__name__
        raise InvalidArgument(f"attachments must be a sequence of Attachment (got {kind})")
    return tuple(check_attachment(a, f"attachments[{i}]") for i, a in enumerate(attachments))


def check_attachment(a: object, where: str) -> Attachment:
    if not isinstance(a, Attachment):
        raise InvalidArgument(f"{where} must be an Attachment (got {type(a).__name__})")
    path = require_text(a.path, f"{where}.path")
    if not isinstance(a.sha256, str) or not _SHA256_HEX.fullmatch(a.sha256):
        raise InvalidArgument(f"{where}.sha256 must be 64 hex characters (got {a.sha256!r})")
    if not isinstance(a.size, int) or isinstance(a.size, bool) or a.size < 0:
        raise InvalidArgument(f"{where}.size must be a non-negative integer (got {a.size!r})")
    content = check_content(a.content, f"{where}.content")
    if not isinstance(a.pinned, bool):
        raise InvalidArgument(f"{where}.pinned must be True or False (got {a.pinned!r})")
    return Attachment(path=path, sha256=a.sha256.lower(), size=a.size, content=content, pinned=a.pinned)


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
