"""Turning a user's search text into safe SQL, for both search paths.

Search means: every word of the query appears in the message (AND). With FTS5 a word matches
token prefixes ("pars" finds "parser"); the LIKE fallback matches substrings, which finds the same
messages and a few more. A message also matches when every term appears in the path of one of its
attachments (case-insensitive substring, on both paths), so a file name finds the message it was
sent with; that hit's snippet is the path with the terms marked. A reply (a tool step) matches
too when every term appears in one of its tool results' content, or in one of its calls' name,
text or arguments (substring, on both paths: a command's output is not worth a full-text index
of its own), so "pytest" finds the step that ran it; that snippet names the tool and marks the
terms in what matched. The user's text is never spliced
into an FTS5 expression unquoted, so quotes, `NEAR`, `*` or `-` in a query cannot raise a syntax
error.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from typing import Any, Final

from .migrations import FTS_TABLE
from .models import Message
from .rows import MESSAGE_COLUMNS, message_from_row, with_attachments
from .tool_rows import with_tool_results

SNIPPET_OPEN: Final = "«"
SNIPPET_CLOSE: Final = "»"
SNIPPET_ELLIPSIS: Final = "…"
SNIPPET_TOKENS: Final = 12
"""FTS5 snippet length, in tokens."""
_SNIPPET_CHARS: Final = 48
"""LIKE-path snippet: characters kept on each side of the first match."""

_WORD = re.compile(r"\w+")
_CALL_TEXT: Final = (
    "(coalesce(json_extract(c.value, '$.name'), '') || char(10) || "
    "coalesce(json_extract(c.value, '$.text'), '') || char(10) || "
    "coalesce(json_extract(c.value, '$.arguments'), ''))"
)
"""What a stored call (an item of `messages.tool_calls`) is searched by."""
TOOL_MARK: Final = "⚙"


def fts_query(query: str) -> str | None:
    """An FTS5 MATCH expression for `query`: each word quoted and prefix-matched, ANDed.

    None when the query has no word characters (e.g. "->"); the caller then uses LIKE, which can
    find punctuation that the FTS tokenizer drops.
    """
    words = _WORD.findall(query)
    if not words:
        return None
    return " ".join('"' + word.replace('"', '""') + '"*' for word in words)


def like_terms(query: str) -> list[str]:
    """Whitespace-separated terms of `query`, each a LIKE pattern with `\\` as the escape."""
    escaped = (term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") for term in query.split())
    return [f"%{term}%" for term in escaped]


def _terms_pattern(query: str) -> re.Pattern[str] | None:
    """Any term of `query`, case-insensitive, the longest first; None when there is none."""
    terms = sorted({t for t in query.split() if t}, key=len, reverse=True)
    if not terms:
        return None
    return re.compile("|".join(re.escape(t) for t in terms), re.IGNORECASE)


def _mark(pattern: re.Pattern[str], text: str) -> str:
    return pattern.sub(lambda m: SNIPPET_OPEN + m.group(0) + SNIPPET_CLOSE, text)


def like_snippet(content: str, query: str) -> str:
    """An excerpt around the first term found in `content`, terms marked like FTS5's snippet."""
    pattern = _terms_pattern(query)
    first = None if pattern is None else pattern.search(content)
    if pattern is None or first is None:
        return one_line(content[: 2 * _SNIPPET_CHARS])
    start = max(0, first.start() - _SNIPPET_CHARS)
    end = min(len(content), first.end() + _SNIPPET_CHARS)
    marked = _mark(pattern, content[start:end])
    prefix = SNIPPET_ELLIPSIS if start > 0 else ""
    suffix = SNIPPET_ELLIPSIS if end < len(content) else ""
    return prefix + one_line(marked) + suffix


def one_line(text: str) -> str:
    """One line: a snippet is shown in a list row or a terminal line."""
    return " ".join(text.split())


def find(
    conn: sqlite3.Connection, query: str, use_fts: bool, session_id: str | None, limit: int
) -> list[tuple[Message, str]]:
    """Matching messages with their snippets (and their attachments and tool results): FTS5
    ranked by bm25 when `use_fts` and the query has words, then the messages found only by an
    attachment's path, then those found only by a tool step; else LIKE over content, paths and
    tool steps at once, ordered by most recently updated session, then position."""
    scope = Scope(
        "" if session_id is None else " AND m.session_id = ?",
        () if session_id is None else (session_id,),
    )
    match = fts_query(query) if use_fts else None
    if match is None:
        found = _like_find(conn, query, scope, limit)
    else:
        found = _fts_find(conn, match, scope, limit)
        for more in (_path_find, _tool_find):
            seen = {m.id for m, _ in found}
            found += [hit for hit in more(conn, query, scope, limit) if hit[0].id not in seen][
                : limit - len(found)
            ]
    messages = with_tool_results(conn, with_attachments(conn, [m for m, _ in found]))
    return [
        (m, tool_snippet(m, query) if snippet is None else snippet)
        for m, (_, snippet) in zip(messages, found, strict=True)
    ]


@dataclass(frozen=True, slots=True)
class Scope:
    """The optional `AND m.session_id = ?` of a search, with its argument."""

    sql: str
    args: tuple[Any, ...]


Found = list[tuple[Message, str | None]]
"""Messages with their snippets; None for a tool step's, made once its results are read."""


def _fts_find(conn: sqlite3.Connection, match: str, scope: Scope, limit: int) -> Found:
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS}, snippet({FTS_TABLE}, 0, ?, ?, ?, ?) AS snippet "
        f"FROM {FTS_TABLE} JOIN messages m ON m.id = {FTS_TABLE}.rowid "
        f"WHERE {FTS_TABLE} MATCH ?{scope.sql} ORDER BY rank LIMIT ?",
        (SNIPPET_OPEN, SNIPPET_CLOSE, SNIPPET_ELLIPSIS, SNIPPET_TOKENS, match, *scope.args, limit),
    )
    return [(message_from_row(row), one_line(row["snippet"])) for row in rows]


def _path_find(conn: sqlite3.Connection, query: str, scope: Scope, limit: int) -> Found:
    """Messages with an attachment whose path holds every term: the complement of the FTS path,
    whose index holds only the typed text."""
    terms = like_terms(query)
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS}, {_matched_path(terms)} AS matched_path "
        "FROM messages m JOIN sessions s ON s.id = m.session_id "
        f"WHERE {_has_path(terms)}{scope.sql} ORDER BY s.updated_at DESC, m.position LIMIT ?",
        (*terms, *terms, *scope.args, limit),
    )
    return [(message_from_row(row), path_snippet(row["matched_path"], query)) for row in rows]


def _tool_find(conn: sqlite3.Connection, query: str, scope: Scope, limit: int) -> Found:
    """Tool steps whose results or calls hold every term: the complement of the FTS path."""
    terms = like_terms(query)
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages m JOIN sessions s ON s.id = m.session_id "
        f"WHERE {_has_tool(terms)}{scope.sql} ORDER BY s.updated_at DESC, m.position LIMIT ?",
        (*terms, *terms, *scope.args, limit),
    )
    return [(message_from_row(row), None) for row in rows]


def _like_find(conn: sqlite3.Connection, query: str, scope: Scope, limit: int) -> Found:
    """Content, attachment paths and tool steps in one statement, so the order is one order."""
    terms = like_terms(query)
    in_content = _every_term("m.content", terms)
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS}, ({in_content}) AS in_content, {_matched_path(terms)} AS matched_path "
        "FROM messages m JOIN sessions s ON s.id = m.session_id "
        f"WHERE (({in_content}) OR {_has_path(terms)} OR {_has_tool(terms)}){scope.sql} "
        "ORDER BY s.updated_at DESC, m.position LIMIT ?",
        (*terms, *terms, *terms, *terms, *terms, *terms, *scope.args, limit),
    )
    return [(message_from_row(row), _like_hit_snippet(row, query)) for row in rows]


def _like_hit_snippet(row: sqlite3.Row, query: str) -> str | None:
    """The content's excerpt when the typed text matched, else the matching attachment's path,
    else None (a tool step's, made once its results are read)."""
    if row["in_content"]:
        return like_snippet(row["content"], query)
    if row["matched_path"] is not None:
        return path_snippet(row["matched_path"], query)
    return None


def _every_term(column: str, terms: list[str]) -> str:
    """`column LIKE ? AND ...`, one placeholder per term (bound in the terms' order)."""
    return " AND ".join(f"{column} LIKE ? ESCAPE '\\'" for _ in terms)


def _matched_path(terms: list[str]) -> str:
    """The first attachment path (in attachment order) of `m` that holds every term, else NULL."""
    return (
        f"(SELECT a.path FROM attachments a WHERE a.message_id = m.id AND {_every_term('a.path', terms)} "
        "ORDER BY a.ordinal LIMIT 1)"
    )


def _has_path(terms: list[str]) -> str:
    return f"m.id IN (SELECT a.message_id FROM attachments a WHERE {_every_term('a.path', terms)})"


def _has_tool(terms: list[str]) -> str:
    """A result's content or a call holds every term (the terms are bound twice, in order)."""
    return (
        f"(m.id IN (SELECT r.message_id FROM tool_results r WHERE {_every_term('r.content', terms)}) "
        "OR (m.tool_calls <> '[]' AND EXISTS (SELECT 1 FROM json_each(m.tool_calls) c "
        f"WHERE {_every_term(_CALL_TEXT, terms)})))"
    )


def tool_snippet(message: Message, query: str) -> str:
    """A tool step's snippet: the first result, else the first call, holding every term, as
    "⚙ tool: excerpt" (the first result or call when none holds them all as Python compares)."""
    terms = [t.casefold() for t in query.split()]

    def holds(text: str) -> bool:
        folded = text.casefold()
        return all(t in folded for t in terms)

    candidates = [(r.tool, r.content) for r in message.tool_results]
    candidates += [(c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in message.tool_calls]
    candidates += [(c.name, f"{c.name} {c.text}") for c in message.tool_calls]
    tool, text = next(
        (item for item in candidates if holds(item[1])), candidates[0] if candidates else ("", "")
    )
    return f"{TOOL_MARK} {one_line(tool) or '?'}: {like_snippet(text, query)}"


def path_snippet(path: str, query: str) -> str:
    """An attachment's path as a snippet, every term marked (paths are short: kept whole)."""
    pattern = _terms_pattern(query)
    return one_line(path if pattern is None else _mark(pattern, path))
