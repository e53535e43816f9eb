"""Tool steps and undo data in session exports (format version 5; `exchange.py` has the rest).

In the JSON, each message carries its `tool_calls` (`[{"id", "name", "arguments", "text",
"error"}]`) and `tool_results` (`[{"call_index", "call_id", "tool", "decision", "content", "ok",
"reason", "details", "created_at"}]`); the document carries `undo_records` (`[{"message_position",
"call_index", "path", "before_sha256", "after_sha256", "created_at", "undone_at"}]`, in the order
they were made) and `blobs` (`{sha256: base64 of the bytes}`, each file version once). An import
checks every field as the store checks a caller's, and every blob against its hash, so a file
that was edited by hand cannot put bytes back that are not the ones recorded. Pure: no database.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .errors import InvalidImport
from .input_text import replace_surrogates
from .models import Message, StoredToolCall, ToolResult, UndoRecord
from .tool_rows import DECISIONS, SHA256_HEX, result_dict, tool_call_dict

PREFIX: Final = "invalid session file: "
_BACKTICKS: Final = re.compile(r"`+")


@dataclass(frozen=True, slots=True)
class ImportedUndoRecord:
    message_position: int
    """The index of its message in the file's `messages`."""
    call_index: int
    path: str
    before_sha256: str | None
    after_sha256: str | None
    created_at: float
    undone_at: float | None


# -- export -----------------------------------------------------------------------------------


def message_json(m: Message) -> dict[str, Any]:
    """A message's calls and results, for its entry in the JSON export."""
    return {
        "tool_calls": [tool_call_dict(c) for c in m.tool_calls],
        "tool_results": [result_dict(r) for r in m.tool_results],
    }


def undo_json(
    records: Sequence[UndoRecord], positions: Mapping[int, int], blobs: Mapping[str, bytes]
) -> dict[str, Any]:
    """The document's `undo_records` and `blobs` (`positions`: message id -> position)."""
    return {
        "undo_records": [
            {
                "message_position": positions[r.message_id],
                "call_index": r.call_index,
                "path": r.path,
                "before_sha256": r.before_sha256,
                "after_sha256": r.after_sha256,
                "created_at": r.created_at,
                "undone_at": r.undone_at,
            }
            for r in records
        ],
        "blobs": {sha: base64.b64encode(data).decode("ascii") for sha, data in sorted(blobs.items())},
    }


def tool_markdown(m: Message) -> list[str]:
    """A reply's calls, each followed by its result, as readable Markdown lines: the arguments
    as a JSON block, the result's decision and outcome, then its content whole."""
    results = {r.call_index: r for r in m.tool_results}
    lines: list[str] = []
    for i, call in enumerate(m.tool_calls):
        invalid = f" (not a valid call: {' '.join(call.error.split())})" if call.error else ""
        lines += ["", f"🔧 Tool call {i + 1}: {code_span(call.name or '?')}{invalid}", ""]
        lines += fenced(json.dumps(call.arguments, ensure_ascii=False, indent=2), "json")
        result = results.get(i)
        if result is None:
            lines += ["", "↳ no result (the call was never decided)"]
            continue
        outcome = "ok" if result.ok else "failed"
        why = f", {' '.join(result.reason.split())}" if result.reason else ""
        lines += ["", f"↳ Result: {outcome} ({result.decision}{why})", ""]
        lines += fenced(result.content)
    return lines


def fenced(text: str, info: str = "") -> list[str]:
    """A fenced block holding `text` whole (the fence longer than any backtick run in it)."""
    fence = "`" * max(3, longest_backticks(text) + 1)
    return [fence + info, text, fence]


def code_span(text: str) -> str:
    """`text` as inline code on one line, whatever backticks or newlines it holds."""
    flat = " ".join(text.splitlines()) or text
    ticks = "`" * (longest_backticks(flat) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{ticks}{pad}{flat}{pad}{ticks}"


def longest_backticks(text: str) -> int:
    return max((len(run) for run in _BACKTICKS.findall(text)), default=0)


# -- import -----------------------------------------------------------------------------------


def tool_calls(items: object, where: str) -> tuple[StoredToolCall, ...]:
    return tuple(
        _call(item, f"{where}.tool_calls[{i}]") for i, item in enumerate(_list(items, where, "tool_calls"))
    )


def tool_results(items: object, where: str, calls: int) -> tuple[ToolResult, ...]:
    """A message's results: one per call at most, each naming one of its `calls`."""
    found = [
        _result(item, f"{where}.tool_results[{i}]")
        for i, item in enumerate(_list(items, where, "tool_results"))
    ]
    seen: set[int] = set()
    for i, r in enumerate(found):
        if r.call_index >= calls or r.call_index in seen:
            problem = "has no such call" if r.call_index >= calls else "has a result for it already"
            raise InvalidImport(
                PREFIX + f"{where}.tool_results[{i}].call_index {r.call_index}: the message {problem}"
            )
        seen.add(r.call_index)
    return tuple(sorted(found, key=lambda r: r.call_index))


def undo_records(items: object, messages: int, blobs: Mapping[str, bytes]) -> tuple[ImportedUndoRecord, ...]:
    records = []
    for i, item in enumerate(_list(items, "the file", "undo_records")):
        where = f"undo_records[{i}]"
        raw = _mapping(item, where)
        position = _count(raw, "message_position", where)
        if position >= messages:
            raise InvalidImport(PREFIX + f"{where}.message_position {position} names no message")
        path = _str(raw, "path", where)
        if not os.path.isabs(path):
            raise InvalidImport(PREFIX + f"{where}.path must be absolute (got {path!r})")
        before, after = (_sha(raw, key, where, blobs) for key in ("before_sha256", "after_sha256"))
        if before is None and after is None:
            raise InvalidImport(PREFIX + f"{where} has neither before_sha256 nor after_sha256")
        undone = raw.get("undone_at")
        records.append(
            ImportedUndoRecord(
                message_position=position,
                call_index=_count(raw, "call_index", where),
                path=path,
                before_sha256=before,
                after_sha256=after,
                created_at=_seconds(raw.get("created_at"), f"{where}.created_at"),
                undone_at=None if undone is None else _seconds(undone, f"{where}.undone_at"),
            )
        )
    return tuple(records)


def blobs(raw: object) -> dict[str, bytes]:
    """The document's file versions, each checked against its sha256."""
    if raw is None:
        return {}
    found = {}
    for sha, encoded in _mapping(raw, "blobs").items():
        where = f"blobs[{sha!r}]"
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise InvalidImport(PREFIX + f"{where}: a key must be 64 lowercase hex characters")
        if not isinstance(encoded, str):
            raise InvalidImport(PREFIX + f"{where} must be base64 text (got {_kind(encoded)})")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidImport(PREFIX + f"{where} is not valid base64") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise InvalidImport(PREFIX + f"{where}: the bytes do not have that sha256")
        found[sha] = data
    return found


def _call(item: object, where: str) -> StoredToolCall:
    raw = _mapping(item, where)
    arguments = raw.get("arguments")
    if not isinstance(arguments, dict):
        raise InvalidImport(PREFIX + f"{where}.arguments must be an object (got {_kind(arguments)})")
    return StoredToolCall(
        id=_str(raw, "id", where, ""),
        name=_str(raw, "name", where),
        arguments=arguments,
        text=_str(raw, "text", where, ""),
        error=_str(raw, "error", where, ""),
    )


def _result(item: object, where: str) -> ToolResult:
    raw = _mapping(item, where)
    decision = _str(raw, "decision", where)
    if decision not in DECISIONS:
        raise InvalidImport(
            PREFIX + f"{where}.decision must be one of {', '.join(DECISIONS)} (got {decision!r})"
        )
    ok = raw.get("ok")
    if not isinstance(ok, bool):
        raise InvalidImport(PREFIX + f"{where}.ok must be true or false (got {ok!r})")
    details = raw.get("details")
    if details is None:
        details = {}
    elif not isinstance(details, dict):
        raise InvalidImport(PREFIX + f"{where}.details must be an object (got {_kind(details)})")
    return ToolResult(
        call_index=_count(raw, "call_index", where),
        call_id=_str(raw, "call_id", where, ""),
        tool=_str(raw, "tool", where),
        decision=decision,
        content=_str(raw, "content", where),
        ok=ok,
        reason=_str(raw, "reason", where, ""),
        details=details,
        created_at=_seconds(raw.get("created_at"), f"{where}.created_at"),
    )


def _sha(raw: Mapping[str, Any], key: str, where: str, blobs: Mapping[str, bytes]) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or value not in blobs:
        raise InvalidImport(PREFIX + f"{where}.{key} names no entry of blobs (got {value!r})")
    return value


def _list(items: object, where: str, key: str) -> list[Any]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise InvalidImport(PREFIX + f"{where}.{key} must be a list (got {_kind(items)})")
    return items


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidImport(PREFIX + f"{where} must be an object (got {_kind(value)})")
    return value


def _str(raw: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = raw.get(key)
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise InvalidImport(PREFIX + f"{where}.{key} must be a str (got {_kind(value)})")
    return replace_surrogates(value)


def _count(raw: Mapping[str, Any], key: str, where: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidImport(PREFIX + f"{where}.{key} must be a non-negative integer (got {value!r})")
    return value


def _seconds(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidImport(PREFIX + f"{where} must be Unix seconds (got {value!r})")
    return float(value)


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__
