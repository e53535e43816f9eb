"""Session exports (Markdown for people, JSON for re-import) and validation of imports.

The JSON format is versioned (`{"format": "velo-chat.session", "version": 5, ...}`) so a later
velo-chat can still read old files and an old one refuses new files clearly. Version history:

- 1: the session and its messages; a reply's reasoning inline in its content (a leading `<think>`
  block), which an import moves out as the schema migration does.
- 2: each reply's `reasoning`, apart from its `content`.
- 3: each message's `attachments` (`[{"path", "sha256", "size", "content"}]`, empty when none),
  the session's `working_dir`, and the top-level `drafts` (messages queued but not sent:
  `[{"text", "attachments", "created_at"}]`), so an export loses nothing the user typed.
- 4: each attachment's `pinned`, and the session's `continues` (it continues its parent after a
  compaction) and `view_start` (the first message the model sees: docs/compaction.md).
- 5: each reply's `tool_calls` and `tool_results`, and the session's `undo_records` with the
  file versions they name (`blobs`, base64): `tool_exchange.py` has the fields.

Versions 1 to 4 are still read (no attachments, drafts or working folder before 3; nothing
pinned, no continuation and the whole history in view before 4; no tool steps and nothing to
undo before 5). Database ids are
exported for reference only: an import always gets a new session id, so importing the same file
twice gives two sessions, never a collision. Everything here is pure (no database access).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeGuard

from . import tool_exchange
from .errors import InvalidImport
from .input_text import BinaryInput, decode_text, replace_surrogates
from .models import ROLES, STATUSES, Attachment, Draft, Message, Session
from .models import StoredToolCall, ToolResult, UndoRecord
from .reasoning import split_inline
from .tool_exchange import ImportedUndoRecord
from .tool_exchange import code_span as _code_span
from .tool_exchange import longest_backticks as _longest_backticks

FORMAT: Final = "velo-chat.session"
FORMAT_VERSION: Final = 5
_PREFIX: Final = "invalid session file: "
_SHA256_HEX: Final = re.compile(r"[0-9a-fA-F]{64}")
VIEW_STARTS_HERE: Final = (
    "*The model's view begins here: the messages above left its context when it was full.*"
)


@dataclass(frozen=True, slots=True)
class ImportedMessage:
    role: str
    content: str
    status: str
    prompt_tokens: int | None
    completion_tokens: int | None
    stats: dict[str, Any]
    created_at: float
    reasoning: str = ""
    attachments: tuple[Attachment, ...] = ()
    tool_calls: tuple[StoredToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()


@dataclass(frozen=True, slots=True)
class ImportedDraft:
    text: str
    attachments: tuple[Attachment, ...]
    created_at: float


@dataclass(frozen=True, slots=True)
class ImportedSession:
    """A validated session file, ready to be written by the store."""

    title: str | None
    created_at: float
    updated_at: float
    profile: str
    system_prompt: str
    model_fingerprint: str | None
    messages: tuple[ImportedMessage, ...] = field(default=())
    working_dir: str | None = None
    drafts: tuple[ImportedDraft, ...] = field(default=())
    continues: bool = False
    view_start: int = 0
    undo_records: tuple[ImportedUndoRecord, ...] = field(default=())
    blobs: Mapping[str, bytes] = field(default_factory=dict)
    """The file versions `undo_records` name, by sha256 (checked against it)."""


def iso_utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def export_json(
    session: Session,
    messages: Sequence[Message],
    drafts: Sequence[Draft],
    exported_at: float,
    undo_records: Sequence[UndoRecord] = (),
    blobs: Mapping[str, bytes] | None = None,
) -> dict[str, Any]:
    """The versioned JSON document for one session (a dict; the caller serialises it).
    `undo_records`: the session's, undone ones included; `blobs`: the versions they name."""
    positions = {m.id: m.position for m in messages}
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported_at": exported_at,
        "session": {
            "id": session.id,
            "title": session.title,
            "created_at": session.created_at,
            "updated_at": session.updated_at,
            "profile": session.profile,
            "system_prompt": session.system_prompt,
            "model_fingerprint": session.model_fingerprint,
            "parent_session_id": session.parent_session_id,
            "forked_from_message_id": session.forked_from_message_id,
            "working_dir": session.working_dir,
            "continues": session.continues,
            "view_start": session.view_start,
        },
        "messages": [
            {
                "position": m.position,
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "status": m.status,
                "prompt_tokens": m.prompt_tokens,
                "completion_tokens": m.completion_tokens,
                "stats": dict(m.stats),
                "created_at": m.created_at,
                "attachments": [_attachment_json(a) for a in m.attachments],
                **tool_exchange.message_json(m),
            }
            for m in messages
        ],
        **tool_exchange.undo_json(undo_records, positions, blobs or {}),
        "drafts": [
            {
                "text": d.text,
                "attachments": [_attachment_json(a) for a in d.attachments],
                "created_at": d.created_at,
            }
            for d in drafts
        ],
    }


def _attachment_json(a: Attachment) -> dict[str, Any]:
    return {"path": a.path, "sha256": a.sha256, "size": a.size, "content": a.content, "pinned": a.pinned}


def export_markdown(session: Session, messages: Sequence[Message], drafts: Sequence[Draft] = ()) -> str:
    """A readable transcript: a header with the session's facts, then one section per message,
    then the drafts not sent yet.

    A message's attachments follow its text, each as a "📎 `path` (N bytes)" line and a fenced
    block holding the whole content as it was sent (the fence longer than any backtick run in
    it), so the Markdown export is complete on its own, not a list of files that may change.
    A reply's tool calls follow it, each with its arguments and its result (`tool_markdown`)."""
    lines = [f"# {session.title or 'Untitled session'}", ""]
    lines.append(f"- Session: `{session.id}`")
    lines.append(f"- Profile: {session.profile}")
    lines.append(f"- Created: {iso_utc(session.created_at)}")
    lines.append(f"- Updated: {iso_utc(session.updated_at)}")
    if session.model_fingerprint:
        lines.append(f"- Model: `{session.model_fingerprint}`")
    if session.parent_session_id:
        relation = "Continues" if session.continues else "Forked from"
        lines.append(f"- {relation}: `{session.parent_session_id}`")
    if session.working_dir:
        lines.append(f"- Working folder: {_code_span(session.working_dir)}")
    lines.append("")
    if session.system_prompt:
        lines += ["## System prompt", "", session.system_prompt, ""]
    for message in messages:
        if session.view_start and message.position == session.view_start:
            lines += ["---", "", VIEW_STARTS_HERE, ""]
        lines += [f"## {message.role.capitalize()}", ""]
        if message.reasoning:  # collapsed, as in the transcript
            lines += ["<details><summary>Reasoning</summary>", "", message.reasoning, "", "</details>", ""]
        lines.append(message.content)
        lines += _attachments_markdown(message.attachments)
        lines += tool_exchange.tool_markdown(message)
        if message.status != "complete":
            lines += ["", f"*({message.status})*"]
        lines.append("")
    if drafts:
        lines += ["## Drafts (not sent)", ""]
        for draft in drafts:
            lines += [f"### Queued {iso_utc(draft.created_at)}", "", draft.text]
            lines += _attachments_markdown(draft.attachments)
            lines.append("")
    return "\n".join(lines)


def _attachments_markdown(attachments: Sequence[Attachment]) -> list[str]:
    lines: list[str] = []
    for a in attachments:
        fence = "`" * max(3, _longest_backticks(a.content) + 1)
        pin = ", pinned" if a.pinned else ""
        lines += ["", f"📎 {_code_span(a.path)} ({a.size} bytes{pin})", "", fence, a.content, fence]
    return lines


def parse_import(data: Mapping[str, Any] | str | bytes) -> ImportedSession:
    """Validate a session file (parsed or raw JSON text). Raises `InvalidImport` naming the first
    bad field, e.g. `messages[3].role must be one of system, user, assistant (got 'bot')`."""
    if isinstance(data, bytes):  # the same rules as every other input (input_text.py)
        try:
            data = decode_text(data, "the session file").text
        except BinaryInput:
            raise InvalidImport(_PREFIX + "it contains NUL bytes (binary, not text)") from None
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidImport(_PREFIX + f"not JSON ({exc})") from None
    doc = _mapping(data, "the file")
    if doc.get("format") != FORMAT:
        raise InvalidImport(_PREFIX + f"format must be {FORMAT!r} (got {doc.get('format')!r})")
    version = doc.get("version")
    if not _is_int(version) or version < 1:
        raise InvalidImport(_PREFIX + f"version must be a positive integer (got {version!r})")
    if version > FORMAT_VERSION:
        raise InvalidImport(
            f"session file version {version} is newer than this velo-chat reads ({FORMAT_VERSION})"
        )
    raw = _mapping(doc.get("session"), "session")
    created_at = _time(raw, "created_at", "session", None)
    profile = _get(raw, "profile", str, "session")
    if not profile.strip():
        raise InvalidImport(_PREFIX + "session.profile must not be empty")
    items = doc.get("messages")
    if not isinstance(items, list):
        raise InvalidImport(_PREFIX + f"messages must be a list (got {_kind(items)})")
    working_dir = None
    drafts: tuple[ImportedDraft, ...] = ()
    if version >= 3:
        working_dir = _get(raw, "working_dir", str, "session", optional=True)
        drafts = _drafts(doc.get("drafts"), created_at, version)
    messages = tuple(_message(m, f"messages[{i}]", created_at, version) for i, m in enumerate(items))
    continues, view_start = (
        (_bool(raw, "continues", "session"), _view_start(raw, messages)) if version >= 4 else (False, 0)
    )
    blobs = tool_exchange.blobs(doc.get("blobs")) if version >= 5 else {}
    undo = tool_exchange.undo_records(doc.get("undo_records"), len(messages), blobs) if version >= 5 else ()
    return ImportedSession(
        title=_get(raw, "title", str, "session", optional=True),
        created_at=created_at,
        updated_at=_time(raw, "updated_at", "session", created_at),
        profile=profile,
        system_prompt=_get(raw, "system_prompt", str, "session", optional=True) or "",
        model_fingerprint=_get(raw, "model_fingerprint", str, "session", optional=True),
        messages=messages,
        working_dir=working_dir if working_dir and working_dir.strip() else None,
        drafts=drafts,
        continues=continues,
        view_start=view_start,
        undo_records=undo,
        blobs=blobs,
    )


def _bool(raw: Mapping[str, Any], key: str, where: str) -> bool:
    value = raw.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidImport(_PREFIX + f"{where}.{key} must be true or false (got {value!r})")
    return value


def _view_start(raw: Mapping[str, Any], messages: Sequence[ImportedMessage]) -> int:
    """The session's `view_start`: 0, or the index of one of its user messages (the import
    numbers messages from 0 in file order, as the export wrote them)."""
    value = _count(raw, "view_start", "session") or 0
    if value and (value >= len(messages) or messages[value].role != "user"):
        raise InvalidImport(
            _PREFIX + f"session.view_start must be 0 or the index of a user message (got {value})"
        )
    return value


def _drafts(items: object, default_time: float, version: int = FORMAT_VERSION) -> tuple[ImportedDraft, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidImport(_PREFIX + f"drafts must be a list (got {_kind(items)})")
    drafts = []
    for i, item in enumerate(items):
        where = f"drafts[{i}]"
        raw = _mapping(item, where)
        drafts.append(
            ImportedDraft(
                text=_get(raw, "text", str, where),
                attachments=_attachments(raw.get("attachments"), where, version),
                created_at=_time(raw, "created_at", where, default_time),
            )
        )
    return tuple(drafts)


def _attachments(items: object, where: str, version: int) -> tuple[Attachment, ...]:
    """A message's or draft's attachments; each field checked as the store checks a caller's."""
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidImport(_PREFIX + f"{where}.attachments must be a list (got {_kind(items)})")
    return tuple(_attachment(item, f"{where}.attachments[{i}]", version) for i, item in enumerate(items))


def _attachment(item: object, where: str, version: int) -> Attachment:
    raw = _mapping(item, where)
    path = _get(raw, "path", str, where)
    if not path.strip():
        raise InvalidImport(_PREFIX + f"{where}.path must not be empty")
    sha256 = _get(raw, "sha256", str, where)
    if not _SHA256_HEX.fullmatch(sha256):
        raise InvalidImport(_PREFIX + f"{where}.sha256 must be 64 hex characters (got {sha256!r})")
    size = _count(raw, "size", where)
    if size is None:
        raise InvalidImport(_PREFIX + f"{where}.size must be a non-negative integer (got null)")
    pinned = _bool(raw, "pinned", where) if version >= 4 else False
    return Attachment(
        path=path, sha256=sha256.lower(), size=size, content=_get(raw, "content", str, where), pinned=pinned
    )


def _message(item: object, where: str, default_time: float, version: int) -> ImportedMessage:
    raw = _mapping(item, where)
    role = _get(raw, "role", str, where)
    if role not in ROLES:
        raise InvalidImport(_PREFIX + f"{where}.role must be one of {', '.join(ROLES)} (got {role!r})")
    status = _get(raw, "status", str, where, optional=True) or "complete"
    if status not in STATUSES:
        raise InvalidImport(_PREFIX + f"{where}.status must be one of {', '.join(STATUSES)} (got {status!r})")
    stats = raw.get("stats")
    if stats is None:
        stats = {}
    elif not isinstance(stats, dict):
        raise InvalidImport(_PREFIX + f"{where}.stats must be an object (got {_kind(stats)})")
    content = _get(raw, "content", str, where)
    reasoning = _get(raw, "reasoning", str, where, optional=True) or ""
    if version < 2 and role == "assistant":  # reasoning inline, as velo-chat stored it then
        inline, answer = split_inline(content)
        if inline is not None:
            reasoning, content = inline, answer
    calls = tool_exchange.tool_calls(raw.get("tool_calls"), where) if version >= 5 else ()
    results = tool_exchange.tool_results(raw.get("tool_results"), where, len(calls)) if version >= 5 else ()
    return ImportedMessage(
        tool_calls=calls,
        tool_results=results,
        role=role,
        content=content,
        attachments=_attachments(raw.get("attachments"), where, version) if version >= 3 else (),
        reasoning=reasoning,
        status=status,
        prompt_tokens=_count(raw, "prompt_tokens", where),
        completion_tokens=_count(raw, "completion_tokens", where),
        stats=stats,
        created_at=_time(raw, "created_at", where, default_time),
    )


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidImport(_PREFIX + f"{where} must be an object (got {_kind(value)})")
    return value


def _get(raw: Mapping[str, Any], key: str, kind: type, where: str, optional: bool = False) -> Any:
    value = raw.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind):
        raise InvalidImport(_PREFIX + f"{where}.{key} must be a {kind.__name__} (got {_kind(value)})")
    return replace_surrogates(value) if isinstance(value, str) else value  # a "\ud800" escape


def _count(raw: Mapping[str, Any], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < 0:
        raise InvalidImport(_PREFIX + f"{where}.{key} must be a non-negative integer (got {value!r})")
    return value


def _time(raw: Mapping[str, Any], key: str, where: str, default: float | None) -> float:
    value = raw.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidImport(_PREFIX + f"{where}.{key} must be Unix seconds (got {value!r})")
    return float(value)
