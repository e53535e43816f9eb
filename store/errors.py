"""Errors the session store raises.

Every error is a `StoreError` whose message is one line a user can act on, so the CLI can print
`str(exc)` and exit 2 and the TUI can show it in a toast, without either of them knowing SQLite.
Raw `sqlite3` errors never leave the store: `translate` maps them here.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


class StoreError(Exception):
    """Base class: anything the session store could not do."""


class SessionNotFound(StoreError, LookupError):
    """No session has that id (or id prefix)."""


class MessageNotFound(StoreError, LookupError):
    """No message has that id, or it belongs to another session."""


class DraftNotFound(StoreError, LookupError):
    """No queued draft has that id (sent or deleted meanwhile)."""


class SessionBusy(StoreError):
    """Another writer holds the session (cancelled wait). Nothing was written."""


class AmbiguousId(StoreError, LookupError):
    """An id prefix matches more than one session."""


class StoreLocked(StoreError):
    """Another process held the database past the busy timeout. Nothing was written."""


class StoreReadOnly(StoreError):
    """The database file or its directory cannot be written."""


class StoreFull(StoreError):
    """The disk (or the database's page limit) is full. Nothing was written."""


class StoreCorrupt(StoreError):
    """The file is not a velo-chat database, or it is damaged."""


class IncompatibleStore(StoreError):
    """The database was written by a newer velo-chat (its schema version is unknown here)."""


class InvalidImport(StoreError, ValueError):
    """A session file to import is not a valid velo-chat session export."""


class InvalidArgument(StoreError, ValueError):
    """A value passed to the store breaks a rule (unknown role, empty title, ...)."""


def translate(exc: sqlite3.Error, path: Path, busy_timeout_s: float) -> StoreError:
    """Turn a `sqlite3` error into the `StoreError` that says what happened, in one line.

    Uses the primary SQLite result code (Python 3.11 exposes it), not the message text, so the
    mapping does not depend on the SQLite version's wording.
    """
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreLocked(
            f"session database {path} is locked by another velo-chat process "
            f"(waited {busy_timeout_s:g}s); nothing was written, try again when it finishes"
        )
    if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM):
        return StoreReadOnly(
            f"cannot write the session database {path}: the file or its directory is "
            f"read-only or missing ({exc})"
        )
    if code == sqlite3.SQLITE_FULL:
        return StoreFull(f"session database {path}: disk is full; nothing was written")
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return StoreCorrupt(f"{path} is not a velo-chat session database or is damaged ({exc})")
    if code == sqlite3.SQLITE_IOERR:
        return StoreError(f"session database {path}: disk I/O error ({exc})")
    return StoreError(f"session database {path}: {exc}")
