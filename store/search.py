"""Turning a user's search text into safe SQL, for both search paths.

Search means: every word of the query appears in the message (AND). With FTS5 a word matches
token prefixes ("pars" finds "parser"); the LIKE fallback matches substrings, which finds the same
messages and a few more. The user's text is never spliced into an FTS5 expression unquoted, so
quotes, `NEAR`, `*` or `-` in a query cannot raise a syntax error.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, Final

from .migrations import FTS_TABLE
from .models import Message
from .rows import MESSAGE_COLUMNS, message_from_row

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


def like_snippet(content: str, query: str) -> str:
    """An excerpt around the first term found in `content`, terms marked like FTS5's snippet."""
    terms = sorted({t for t in query.split() if t}, key=len, reverse=True)
    if not terms:
        return one_line(content[: 2 * _SNIPPET_CHARS])
    pattern = re.compile("|".join(re.escape(t) for t in terms), re.IGNORECASE)
    first = pattern.search(content)
    if first is None:
        return one_line(content[: 2 * _SNIPPET_CHARS])
    start = max(0, first.start() - _SNIPPET_CHARS)
    end = min(len(content), first.end() + _SNIPPET_CHARS)
    marked = pattern.sub(lambda m: SNIPPET_OPEN + m.group(0) + SNIPPET_CLOSE, content[start:end])
    prefix = SNIPPET_ELLIPSIS if start > 0 else ""
    suffix = SNIPPET_ELLIPSIS if end < len(content) else ""
    return prefix + one_line(marked) + suffix


def one_line(text: str) -> str:
    """One line: a snippet is shown in a list row or a terminal line."""
    return " ".join(text.split())


def find(
    conn: sqlite3.Connection, query: str, use_fts: bool, session_id: str | None, limit: int
) -> list[tuple[Message, str]]:
    """Matching messages with their snippets: FTS5 ranked by bm25 when `use_fts` and the query
    has words, else LIKE ordered by most recently updated session, then position."""
    scope = "" if session_id is None else " AND m.session_id = ?"
    scope_args: tuple[Any, ...] = () if session_id is None else (session_id,)
    match = fts_query(query) if use_fts else None
    if match is not None:
        rows = conn.execute(
            f"SELECT {MESSAGE_COLUMNS}, snippet({FTS_TABLE}, 0, ?, ?, ?, ?) AS snippet "
            f"FROM {FTS_TABLE} JOIN messages m ON m.id = {FTS_TABLE}.rowid "
            f"WHERE {FTS_TABLE} MATCH ?{scope} ORDER BY rank LIMIT ?",
            (
                SNIPPET_OPEN,
                SNIPPET_CLOSE,
                SNIPPET_ELLIPSIS,
                SNIPPET_TOKENS,
                match,
                *scope_args,
                limit,
            ),
        )
        return [(message_from_row(row), one_line(row["snippet"])) for row in rows]
    terms = like_terms(query)
    where = " AND ".join("m.content LIKE ? ESCAPE '\\'" for _ in terms)
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages m JOIN sessions s ON s.id = m.session_id "
        f"WHERE {where}{scope} ORDER BY s.updated_at DESC, m.position LIMIT ?",
        (*terms, *scope_args, limit),
    )
    return [(message_from_row(row), like_snippet(row["content"], query)) for row in rows]
