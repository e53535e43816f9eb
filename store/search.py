"""Turning a user's search text into safe SQL, for both search paths.

Search means: every word of the query appears in the message (AND). With FTS5 a word matches
token prefixes ("pars" finds "parser"); the LIKE fallback matches substrings, which finds the same
messages and a few more. A message also matches when every term appears in the path of one of its
attachments (case-insensitive substring, on both paths), so a file name finds the message it was
sent with; that hit's snippet is the path with the terms marked. The user's text is never spliced
into an FTS5 expression unquoted, so quotes, `NEAR`, `*` or `-` in a query cannot raise a syntax
error.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import Any, Final

from .migrations import FTS_TABLE
from .models import Message
from .rows import MESSAGE_COLUMNS, message_from_row, with_attachments

SNIPPET_OPEN: Final = "«"
SNIPPET_CLOSE: Final = "»"
SNIPPET_ELLIPSIS: Final = "…"
SNIPPET_TOKENS: Final = 12
"""FTS5 snippet length, in tokens."""
_SNIPPET_CHARS: Final = 48
"""LIKE-path snippet: characters kept on each side of the first match."""

_WORD = re.compile(r"\w+")


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
    """Matching messages with their snippets (and their attachments): FTS5 ranked by bm25 when
    `use_fts` and the query has words, then the messages found only by an attachment's path; else
    LIKE over content and paths at once, ordered by most recently updated session, then position."""
    scope = Scope(
        "" if session_id is None else " AND m.session_id = ?",
        () if session_id is None else (session_id,),
    )
    match = fts_query(query) if use_fts else None
    if match is None:
        found = _like_find(conn, query, scope, limit)
    else:
        found = _fts_find(conn, match, scope, limit)
        seen = {m.id for m, _ in found}
        by_path = [hit for hit in _path_find(conn, query, scope, limit) if hit[0].id not in seen]
        found += by_path[: limit - len(found)]
    messages = with_attachments(conn, [m for m, _ in found])
    return [(m, snippet) for m, (_, snippet) in zip(messages, found, strict=True)]


@dataclass(frozen=True, slots=True)
class Scope:
    """The optional `AND m.session_id = ?` of a search, with its argument."""

    sql: str
    args: tuple[Any, ...]


def _fts_find(conn: sqlite3.Connection, match: str, scope: Scope, limit: int) -> list[tuple[Message, str]]:
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS}, snippet({FTS_TABLE}, 0, ?, ?, ?, ?) AS snippet "
        f"FROM {FTS_TABLE} JOIN messages m ON m.id = {FTS_TABLE}.rowid "
        f"WHERE {FTS_TABLE} MATCH ?{scope.sql} ORDER BY rank LIMIT ?",
        (SNIPPET_OPEN, SNIPPET_CLOSE, SNIPPET_ELLIPSIS, SNIPPET_TOKENS, match, *scope.args, limit),
    )
    return [(message_from_row(row), one_line(row["snippet"])) for row in rows]


def _path_find(conn: sqlite3.Connection, query: str, scope: Scope, limit: int) -> list[tuple[Message, str]]:
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


def _like_find(conn: sqlite3.Connection, query: str, scope: Scope, limit: int) -> list[tuple[Message, str]]:
    """Content and attachment paths in one statement, so the order is one order."""
    terms = like_terms(query)
    in_content = _every_term("m.content", terms)
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS}, ({in_content}) AS in_content, {_matched_path(terms)} AS matched_path "
        "FROM messages m JOIN sessions s ON s.id = m.session_id "
        f"WHERE (({in_content}) OR {_has_path(terms)}){scope.sql} "
        "ORDER BY s.updated_at DESC, m.position LIMIT ?",
        (*terms, *terms, *terms, *terms, *scope.args, limit),
    )
    return [(message_from_row(row), _like_hit_snippet(row, query)) for row in rows]


def _like_hit_snippet(row: sqlite3.Row, query: str) -> str:
    """The content's excerpt when the typed text matched, else the matching attachment's path."""
    if row["in_content"]:
        return like_snippet(row["content"], query)
    return path_snippet(row["matched_path"], query)


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


def path_snippet(path: str, query: str) -> str:
    """An attachment's path as a snippet, every term marked (paths are short: kept whole)."""
    pattern = _terms_pattern(query)
    return one_line(path if pattern is None else _mark(pattern, path))
