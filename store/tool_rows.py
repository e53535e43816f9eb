"""Tool steps and undo data in the database: a reply's calls, their results, file versions by
sha256, and the undo records naming them. Every function runs inside the caller's transaction;
`SessionStore` wraps them (one transaction per call) and `rows` reads the calls and results
with their messages.

Kept apart from `rows` (which imports this module, never the reverse) so the message code stays
readable. The rules on values follow the rest of the store: the caller's models are checked
before anything is written (`InvalidArgument` naming the first bad field), texts go through
`replace_surrogates`, JSON and BLOBs only (no pickle). A call's `arguments` and a result's
`details` are dumped leniently (`str()` of what JSON lacks), as message stats are, so an odd
value can never cost the step it belongs to.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from .errors import InvalidArgument, MessageNotFound, SessionNotFound
from .input_text import replace_surrogates
from .models import Message, StoredToolCall, ToolResult, UndoRecord

DECISIONS: Final = ("auto", "allowed", "allowed_session", "refused", "invalid", "stopped")
"""A result's `decision` (the app's `Decision`: the store keeps its own copy, it never imports
the app)."""
RESULT_FIELDS: Final = (
    "call_index", "call_id", "tool", "decision", "content", "ok", "reason", "details", "created_at",
)  # fmt: skip
RESULT_COLUMNS: Final = ", ".join(f"r.{name}" for name in RESULT_FIELDS)
UNDO_COLUMNS: Final = (
    "u.id, u.session_id, u.message_id, u.call_index, u.path, u.before_sha256, u.after_sha256, "
    "u.created_at, u.undone_at"
)
SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
_IDS_PER_QUERY: Final = 500


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be text (got {type(value).__name__})")
    return replace_surrogates(value)


def check_index(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"{name} must be a non-negative integer (got {value!r})")
    return value


def _json(value: object, name: str) -> str:
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{name} must be a mapping (got {type(value).__name__})")
    return replace_surrogates(json.dumps(dict(value), ensure_ascii=False, default=str))


# -- calls ----------------------------------------------------------------------------------


def check_tool_calls(calls: object) -> str:
    """The caller's calls, checked, as the JSON list `messages.tool_calls` holds."""
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        raise InvalidArgument(f"tool calls must be a sequence of StoredToolCall (got {type(calls).__name__})")
    items = []
    for i, call in enumerate(calls):
        where = f"tool_calls[{i}]"
        if not isinstance(call, StoredToolCall):
            raise InvalidArgument(f"{where} must be a StoredToolCall (got {type(call).__name__})")
        items.append(
            {
                "id": _text(call.id, f"{where}.id"),
                "name": _text(call.name, f"{where}.name"),
                "arguments": json.loads(_json(call.arguments, f"{where}.arguments")),
                "text": _text(call.text, f"{where}.text"),
                "error": _text(call.error, f"{where}.error"),
            }
        )
    return json.dumps(items, ensure_ascii=False)


def tool_calls_from_json(raw: str) -> tuple[StoredToolCall, ...]:
    return tuple(tool_call_from(item) for item in json.loads(raw))


def tool_call_from(item: Mapping[str, Any]) -> StoredToolCall:
    return StoredToolCall(
        id=item["id"], name=item["name"], arguments=dict(item["arguments"]), text=item["text"],
        error=item.get("error", ""),
    )  # fmt: skip


def tool_call_dict(call: StoredToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "text": call.text,
        "error": call.error,
    }


def set_tool_calls(conn: sqlite3.Connection, message_id: int, calls_json: str, now: float) -> None:
    """Replace a reply's calls (checked by `check_tool_calls`). A reply only: a user's message
    makes no calls. Refused when it would drop a call that already has a result."""
    session_id, role = _message_owner(conn, message_id)
    if role != "assistant":
        raise InvalidArgument(f"message {message_id} is a {role} message; only a reply makes tool calls")
    count = len(json.loads(calls_json))
    decided = conn.execute(
        "SELECT MAX(call_index) FROM tool_results WHERE message_id = ?", (message_id,)
    ).fetchone()[0]
    if decided is not None and decided >= count:
        raise InvalidArgument(
            f"message {message_id} has a result for call {decided}; its calls cannot be cut to {count}"
        )
    conn.execute("UPDATE messages SET tool_calls = ? WHERE id = ?", (calls_json, message_id))
    conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id))


# -- results --------------------------------------------------------------------------------


def check_tool_result(result: object) -> ToolResult:
    """The caller's result, checked, with its texts made storable."""
    if not isinstance(result, ToolResult):
        raise InvalidArgument(f"a tool result must be a ToolResult (got {type(result).__name__})")
    if result.decision not in DECISIONS:
        raise InvalidArgument(f"decision must be one of {', '.join(DECISIONS)} (got {result.decision!r})")
    if not isinstance(result.ok, bool):
        raise InvalidArgument(f"ok must be True or False (got {result.ok!r})")
    created = result.created_at
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
        raise InvalidArgument(f"created_at must be Unix seconds (got {created!r})")
    return ToolResult(
        call_index=check_index(result.call_index, "call_index"),
        call_id=_text(result.call_id, "call_id"),
        tool=_text(result.tool, "tool"),
        decision=result.decision,
        content=_text(result.content, "content"),
        ok=result.ok,
        reason=_text(result.reason, "reason"),
        details=json.loads(_json(result.details, "details")),
        created_at=float(created),
    )


def add_tool_result(conn: sqlite3.Connection, message_id: int, result: ToolResult, now: float) -> None:
    """Store what came of one of a reply's calls (checked by `check_tool_result`; a
    `created_at` of 0 takes `now`). The call must exist, and is decided once."""
    session_id, _ = _message_owner(conn, message_id)
    calls = conn.execute("SELECT tool_calls FROM messages WHERE id = ?", (message_id,)).fetchone()[0]
    count = len(json.loads(calls))
    if result.call_index >= count:
        raise InvalidArgument(
            f"message {message_id} has no tool call {result.call_index} (it has {count}); "
            "set_tool_calls first"
        )
    taken = conn.execute(
        "SELECT 1 FROM tool_results WHERE message_id = ? AND call_index = ?", (message_id, result.call_index)
    ).fetchone()
    if taken:
        raise InvalidArgument(f"call {result.call_index} of message {message_id} already has a result")
    insert_tool_result(conn, message_id, replace(result, created_at=result.created_at or now))
    conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id))


def insert_tool_result(conn: sqlite3.Connection, message_id: int, r: ToolResult) -> None:
    conn.execute(
        "INSERT INTO tool_results (message_id, call_index, call_id, tool, decision, reason, content, ok, "
        "details, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (message_id, r.call_index, r.call_id, r.tool, r.decision, r.reason, r.content, int(r.ok),
         json.dumps(r.details, ensure_ascii=False), r.created_at),
    )  # fmt: skip


def result_from(row: Mapping[str, Any] | sqlite3.Row) -> ToolResult:
    return ToolResult(
        call_index=row["call_index"], call_id=row["call_id"], tool=row["tool"], decision=row["decision"],
        content=row["content"], ok=bool(row["ok"]), reason=row["reason"],
        details=json.loads(row["details"]), created_at=row["created_at"],
    )  # fmt: skip


def result_dict(r: ToolResult) -> dict[str, Any]:
    return {name: getattr(r, name) for name in RESULT_FIELDS}


def group_results(found: Iterable[sqlite3.Row]) -> dict[int, tuple[ToolResult, ...]]:
    """Rows ordered by (message_id, call_index) -> each message's results in call order."""
    grouped: dict[int, list[ToolResult]] = {}
    for row in found:
        grouped.setdefault(row["message_id"], []).append(result_from(row))
    return {message_id: tuple(items) for message_id, items in grouped.items()}


def results_of_message(conn: sqlite3.Connection, message_id: int) -> tuple[ToolResult, ...]:
    found = conn.execute(
        f"SELECT r.message_id, {RESULT_COLUMNS} FROM tool_results r WHERE r.message_id = ? "
        "ORDER BY r.call_index",
        (message_id,),
    )
    return group_results(found).get(message_id, ())


def results_of_session(conn: sqlite3.Connection, session_id: str) -> dict[int, tuple[ToolResult, ...]]:
    """Every result of the session's messages, in one query, by message id."""
    return group_results(
        conn.execute(
            f"SELECT r.message_id, {RESULT_COLUMNS} FROM tool_results r "
            "JOIN messages m ON m.id = r.message_id WHERE m.session_id = ? "
            "ORDER BY r.message_id, r.call_index",
            (session_id,),
        )
    )


def with_tool_results(conn: sqlite3.Connection, found: Sequence[Message]) -> list[Message]:
    """`found` (messages of any sessions, e.g. search hits) with their results, read in a few
    `IN (...)` queries rather than one per message."""
    ids = sorted({m.id for m in found if m.tool_calls})
    results: dict[int, tuple[ToolResult, ...]] = {}
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[start : start + _IDS_PER_QUERY]
        marks = ",".join("?" * len(chunk))
        results.update(
            group_results(
                conn.execute(
                    f"SELECT r.message_id, {RESULT_COLUMNS} FROM tool_results r "
                    f"WHERE r.message_id IN ({marks}) ORDER BY r.message_id, r.call_index",
                    chunk,
                )
            )
        )
    return [replace(m, tool_results=results.get(m.id, ())) for m in found]


def copy_tool_results(conn: sqlite3.Connection, source_id: str, target_id: str, below: int) -> None:
    """Copy the results of `source_id`'s messages at positions < `below` to the messages at the
    same positions in `target_id` (a fork: its copies keep their positions and their calls)."""
    conn.execute(
        "INSERT INTO tool_results (message_id, call_index, call_id, tool, decision, reason, content, ok, "
        "details, created_at) SELECT copy.id, r.call_index, r.call_id, r.tool, r.decision, r.reason, "
        "r.content, r.ok, r.details, r.created_at FROM tool_results r "
        "JOIN messages original ON original.id = r.message_id "
        "JOIN messages copy ON copy.session_id = ? AND copy.position = original.position "
        "WHERE original.session_id = ? AND original.position < ? ORDER BY r.message_id, r.call_index",
        (target_id, source_id, below),
    )


# -- file versions ---------------------------------------------------------------------------


def check_bytes(data: object, name: str) -> bytes:
    if not isinstance(data, bytes):
        raise InvalidArgument(f"{name} must be bytes (got {type(data).__name__})")
    return data


def check_sha256(sha256: object) -> str:
    if not isinstance(sha256, str) or not SHA256_HEX.fullmatch(sha256.lower()):
        raise InvalidArgument(f"a blob's sha256 must be 64 hex characters (got {sha256!r})")
    return sha256.lower()


def put_blob(conn: sqlite3.Connection, data: bytes) -> str:
    """Store `data` once (by its sha256, lowercase hex), which is returned."""
    digest = hashlib.sha256(data).hexdigest()
    conn.execute("INSERT OR IGNORE INTO file_blobs (sha256, data) VALUES (?, ?)", (digest, data))
    return digest


def blob(conn: sqlite3.Connection, sha256: str) -> bytes:
    row = conn.execute("SELECT data FROM file_blobs WHERE sha256 = ?", (sha256,)).fetchone()
    if row is None:
        raise InvalidArgument(f"no stored file version has sha256 {sha256}")
    return bytes(row[0])


def blobs(conn: sqlite3.Connection, digests: Iterable[str]) -> dict[str, bytes]:
    wanted = sorted(set(digests))
    found: dict[str, bytes] = {}
    for start in range(0, len(wanted), _IDS_PER_QUERY):
        chunk = wanted[start : start + _IDS_PER_QUERY]
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(f"SELECT sha256, data FROM file_blobs WHERE sha256 IN ({marks})", chunk)
        found.update((row[0], bytes(row[1])) for row in rows)
    return found


def drop_unreferenced_blobs(conn: sqlite3.Connection) -> int:
    """Delete the file versions no undo record names (stored by `put_blob` alone and never
    recorded); those a deleted record named went with it (the schema's trigger)."""
    return conn.execute(
        "DELETE FROM file_blobs WHERE NOT EXISTS (SELECT 1 FROM undo_records u "
        "WHERE u.before_sha256 = file_blobs.sha256 OR u.after_sha256 = file_blobs.sha256)"
    ).rowcount


# -- undo records -----------------------------------------------------------------------------


def check_change(
    call_index: object, path: object, before: object, after: object
) -> tuple[int, str, bytes | None, bytes | None]:
    """An undo record's call index, path (absolute) and versions (bytes, or None for no file,
    not both), checked."""
    index = check_index(call_index, "call_index")
    clean = _text(path, "path")
    if not os.path.isabs(clean):
        raise InvalidArgument(f"an undo record's path must be absolute (got {clean!r})")
    old = None if before is None else check_bytes(before, "before")
    new = None if after is None else check_bytes(after, "after")
    if old is None and new is None:
        raise InvalidArgument("an undo record needs the file before or after the change (both None)")
    return index, clean, old, new


def add_undo_record(
    conn: sqlite3.Connection,
    session_id: str,
    message_id: int,
    call_index: int,
    path: str,
    before: bytes | None,
    after: bytes | None,
    now: float,
    undone_at: float | None = None,
) -> int:
    """Store both versions (once each) and the record naming them; returns the record's id.
    The message must be the session's (`MessageNotFound` otherwise)."""
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        raise SessionNotFound(f"no session {session_id!r}")
    owner, _ = _message_owner(conn, message_id)
    if owner != session_id:
        raise MessageNotFound(f"message {message_id} is not in session {session_id!r}")
    before_sha = None if before is None else put_blob(conn, before)
    after_sha = None if after is None else put_blob(conn, after)
    cursor = conn.execute(
        "INSERT INTO undo_records (session_id, message_id, call_index, path, before_sha256, "
        "after_sha256, created_at, undone_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (session_id, message_id, call_index, path, before_sha, after_sha, now, undone_at),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def undo_record(conn: sqlite3.Connection, record_id: int) -> UndoRecord:
    row = conn.execute(f"SELECT {UNDO_COLUMNS} FROM undo_records u WHERE u.id = ?", (record_id,)).fetchone()
    assert row is not None
    return UndoRecord(**dict(row))


def undo_records(
    conn: sqlite3.Connection, session_id: str, since_position: int | None, include_undone: bool
) -> list[UndoRecord]:
    """The session's records in the order they were made; `since_position`: those whose
    message is at that position or later."""
    found = conn.execute(
        f"SELECT {UNDO_COLUMNS} FROM undo_records u JOIN messages m ON m.id = u.message_id "
        "WHERE u.session_id = ? AND (? IS NULL OR m.position >= ?) AND (? OR u.undone_at IS NULL) "
        "ORDER BY u.id",
        (session_id, since_position, since_position, int(include_undone)),
    )
    return [UndoRecord(**dict(row)) for row in found]


def mark_undone(conn: sqlite3.Connection, record_ids: Sequence[int], when: float) -> None:
    """Set `undone_at` on the records not undone yet (one already undone keeps its time).
    Every id must name a record: `InvalidArgument` for the first that does not, nothing set."""
    if isinstance(record_ids, (str, bytes)) or not isinstance(record_ids, Sequence):
        raise InvalidArgument(f"record_ids must be a sequence of ids (got {type(record_ids).__name__})")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        raise InvalidArgument(f"when must be Unix seconds (got {when!r})")
    ids = [check_index(i, "an undo record id") for i in record_ids]
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[start : start + _IDS_PER_QUERY]
        marks = ",".join("?" * len(chunk))
        known = {row[0] for row in conn.execute(f"SELECT id FROM undo_records WHERE id IN ({marks})", chunk)}
        missing = [i for i in chunk if i not in known]
        if missing:
            raise InvalidArgument(f"no undo record {missing[0]}")
        conn.execute(
            f"UPDATE undo_records SET undone_at = ? WHERE id IN ({marks}) AND undone_at IS NULL",
            (when, *chunk),
        )


def _message_owner(conn: sqlite3.Connection, message_id: object) -> tuple[str, str]:
    """(session id, role) of a message; `MessageNotFound` when there is none."""
    if not isinstance(message_id, int) or isinstance(message_id, bool):
        raise InvalidArgument(f"a message id must be an integer (got {type(message_id).__name__})")
    row = conn.execute("SELECT session_id, role FROM messages WHERE id = ?", (message_id,)).fetchone()
    if row is None:
        raise MessageNotFound(f"no message {message_id!r}")
    return row[0], row[1]
