"""Session exports (Markdown for people, JSON for re-import) and validation of imports.

The JSON format is versioned (`{"format": "velo-chat.session", "version": 2, ...}`) so a later
velo-chat can still read old files and an old one refuses new files clearly. Version 2 added each
reply's `reasoning`, apart from its `content`; a version 1 file's replies carry theirs inline (a
leading `<think>` block), which an import moves out as the schema migration does. Database ids are
exported for reference only: an import always gets a new session id, so importing the same file
twice gives two sessions, never a collision. Everything here is pure (no database access).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeGuard

from .errors import InvalidImport
from .input_text import BinaryInput, decode_text, replace_surrogates
from .models import ROLES, STATUSES, Message, Session
from .reasoning import split_inline

FORMAT: Final = "velo-chat.session"
FORMAT_VERSION: Final = 2
_PREFIX: Final = "invalid session file: "


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


def iso_utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def export_json(session: Session, messages: Sequence[Message], exported_at: float) -> dict[str, Any]:
    """The versioned JSON document for one session (a dict; the caller serialises it)."""
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
            }
            for m in messages
        ],
    }


def export_markdown(session: Session, messages: Sequence[Message]) -> str:
    """A readable transcript: a header with the session's facts, then one section per message."""
    lines = [f"# {session.title or 'Untitled session'}", ""]
    lines.append(f"- Session: `{session.id}`")
    lines.append(f"- Profile: {session.profile}")
    lines.append(f"- Created: {iso_utc(session.created_at)}")
    lines.append(f"- Updated: {iso_utc(session.updated_at)}")
    if session.model_fingerprint:
        lines.append(f"- Model: `{session.model_fingerprint}`")
    if session.parent_session_id:
        lines.append(f"- Forked from: `{session.parent_session_id}`")
    lines.append("")
    if session.system_prompt:
        lines += ["## System prompt", "", session.system_prompt, ""]
    for message in messages:
        lines += [f"## {message.role.capitalize()}", ""]
        if message.reasoning:  # collapsed, as in the transcript
            lines += ["<details><summary>Reasoning</summary>", "", message.reasoning, "", "</details>", ""]
        lines.append(message.content)
        if message.status != "complete":
            lines += ["", f"*({message.status})*"]
        lines.append("")
    return "\n".join(lines)


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
    return ImportedSession(
        title=_get(raw, "title", str, "session", optional=True),
        created_at=created_at,
        updated_at=_time(raw, "updated_at", "session", created_at),
        profile=profile,
        system_prompt=_get(raw, "system_prompt", str, "session", optional=True) or "",
        model_fingerprint=_get(raw, "model_fingerprint", str, "session", optional=True),
        messages=tuple(_message(m, f"messages[{i}]", created_at, version) for i, m in enumerate(items)),
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
    return ImportedMessage(
        role=role,
        content=content,
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
