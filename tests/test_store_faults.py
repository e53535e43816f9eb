"""Session store faults, with real second processes: a locked database, a killed writer, a
read-only directory, a full disk."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from velo_chat.store import (
    SessionStore,
    StoreError,
    StoreFull,
    StoreLocked,
    StoreReadOnly,
)

from tests.support.store_helpers import child_env


# -- faults -------------------------------------------------------------------------------------

_HOLD_LOCK = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("UPDATE sessions SET title = 'held by the other process'")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
    """
)


def test_database_locked_by_a_second_process(db_path: Path) -> None:
    with SessionStore(db_path, busy_timeout_s=0.3) as s:
        session = s.create_session("fast")
        s.add_message(session.id, "user", "before the lock")
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_LOCK, str(db_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            start = time.monotonic()
            with pytest.raises(StoreLocked, match="locked by another velo-chat process"):
                s.add_message(session.id, "user", "during the lock")
            assert time.monotonic() - start >= 0.25
            assert [m.content for m in s.messages(session.id)] == ["before the lock"]  # WAL reads
            with SessionStore(db_path, busy_timeout_s=0.3) as second:  # opening still works
                assert second.get_session(session.id).id == session.id
        finally:
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.close()
            assert holder.wait(timeout=10) == 0
        s.add_message(session.id, "user", "during the lock")  # the retry succeeds
        assert [m.content for m in s.messages(session.id)] == ["before the lock", "during the lock"]
        assert s.get_session(session.id).title == "held by the other process"


_KILLED_MID_REPLY = textwrap.dedent(
    """
    import os, signal, sqlite3, sys
    from velo_chat.store import SessionStore
    store = SessionStore(sys.argv[1])
    session = store.create_session("fast")
    print(session.id, flush=True)
    store.add_message(session.id, "user", "the question")
    reply = store.add_message(session.id, "assistant", "", status="interrupted")
    store.update_message(reply.id, content="half an ans")
    raw = sqlite3.connect(sys.argv[1], isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("UPDATE messages SET content = 'torn write'")
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_killed_while_generating_loses_nothing(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_MID_REPLY, str(db_path)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=30,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    session_id = child.stdout.strip()
    with SessionStore(db_path) as s:
        messages = s.messages(session_id)
        assert [(m.role, m.content, m.status) for m in messages] == [
            ("user", "the question", "complete"),
            ("assistant", "half an ans", "interrupted"),
        ]
        assert s.get_session(session_id).title == "the question"
    assert sqlite3.connect(db_path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _try_paths(paths: list[str]) -> list[str]:
    """Open each path and write a session; one line per path saying what happened."""
    out = []
    for path in paths:
        try:
            with SessionStore(path) as s:
                s.create_session("fast")
            out.append("opened")
        except StoreError as exc:
            out.append(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a forked child reports any failure as a line
            out.append(f"UNEXPECTED {type(exc).__name__}: {exc}")
    return out


def _try_paths_as_nobody(paths: list[str], results: multiprocessing.Queue) -> None:
    """Forked child: drop root so that directory permissions apply."""
    os.setgid(65534)
    os.setuid(65534)
    results.put(_try_paths(paths))


def test_read_only_directory_is_a_clear_error() -> None:
    # Root ignores directory permissions, so as root the attempt runs in a forked child that
    # drops to "nobody"; the folders live in a world-traversable temp dir for that reason.
    base = Path(tempfile.mkdtemp(prefix="velo-store-ro-"))
    try:
        base.chmod(0o755)
        existing = base / "existing"
        SessionStore(existing / "sessions.sqlite3").close()
        (base / "empty").mkdir()
        for folder in (existing, base / "empty"):
            folder.chmod(0o555)
        paths = [
            str(base / "empty" / "sessions.sqlite3"),
            str(base / "empty" / "sub" / "sessions.sqlite3"),
            str(existing / "sessions.sqlite3"),
        ]
        if os.geteuid() == 0:
            ctx = multiprocessing.get_context("fork")
            results = ctx.Queue()
            proc = ctx.Process(target=_try_paths_as_nobody, args=(paths, results))
            proc.start()
            out = results.get(timeout=30)
            proc.join(timeout=30)
        else:
            out = _try_paths(paths)
        assert len(out) == 3
        for line in out:
            assert line.startswith(f"{StoreReadOnly.__name__}: "), line
            assert "\n" not in line
    finally:
        for folder in base.iterdir():
            folder.chmod(0o755)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_full_disk_writes_nothing(store: SessionStore) -> None:
    s = store.create_session("fast")
    store.add_message(s.id, "user", "small")
    # SQLite's page limit stands in for a full disk (same SQLITE_FULL result code). It is a
    # per-connection setting, so this reaches the store's own connection.
    conn = store._conn  # noqa: SLF001
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 1}")
    with pytest.raises(StoreFull, match="disk is full"):
        store.add_message(s.id, "assistant", "x" * 200_000)
    conn.execute("PRAGMA max_page_count = 1073741823")
    assert [m.content for m in store.messages(s.id)] == ["small"]
    store.add_message(s.id, "assistant", "fits now")
