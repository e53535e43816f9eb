"""Session store test helpers: a deterministic clock, and the `db_path` / `store` fixtures
(imported by the store test modules)."""

from __future__ import annotations

import itertools
import os
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

import pytest

from velo_chat.store import SessionStore, rows
from velo_chat.store.migrations import fts5_available

with closing(sqlite3.connect(":memory:")) as _probe:
    HAS_FTS5 = fts5_available(_probe)
needs_fts5 = pytest.mark.skipif(not HAS_FTS5, reason="this SQLite build has no FTS5")


def tick_clock():
    """A clock that ticks one second per call, so ordering by time is deterministic."""
    ticks = itertools.count(1_800_000_000.0, 1.0)
    return lambda: next(ticks)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "sessions.sqlite3"


@pytest.fixture(params=["fts", "like"])
def store(request: pytest.FixtureRequest, db_path: Path):
    """Both search paths: FTS5 (when the build has it) and the forced LIKE fallback."""
    if request.param == "fts" and not HAS_FTS5:
        pytest.skip("this SQLite build has no FTS5")
    with SessionStore(db_path, use_fts=request.param == "fts", clock=tick_clock()) as s:
        assert s.uses_fts is (request.param == "fts")
        yield s


def delete_messages_after(store: SessionStore, session_id: str, position: int) -> int:
    """Delete the session's messages after `position` (-1 clears all), in one write transaction
    of the store, touching the session's `updated_at` when any went; returns how many. The app
    deletes messages only inside `add_exchange(replace_after=...)` (regenerate, edit-last-message);
    the tests use this to check that positions continue from what is left."""
    with store._transaction(write=True) as conn:
        rows.session(conn, session_id)
        deleted = conn.execute(
            "DELETE FROM messages WHERE session_id = ? AND position > ?", (session_id, position)
        ).rowcount
        if deleted:
            conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (store._clock(), session_id))
    return deleted


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
