"""One writer per session, across processes: an exclusive `flock` on a file per session.

Why: a turn is several store calls (the user's message and an empty reply, then streamed updates
of the reply, then its stats). SQLite makes each call atomic, but not the turn: two processes on
one session (two windows, `velo-chat ask --session` beside the TUI) would interleave their turns,
each building its prompt from a history the other is changing, and the transcript would hold a
question answered by a reply to another question. A lock held for the whole turn makes the second
writer wait (told why, so the app can say so) or give up cleanly, with nothing written.

Why `flock` on a file: the kernel releases it when its holder dies, even by `kill -9`, so a crash
never leaves a session locked, and there is no stale-lock guessing. A lock belongs to the open file
description, so opening the file anew for every acquisition makes two threads of one process
exclude each other as two processes do. The file holds "pid <pid>" of its holder, written after
locking, only to name the holder to whoever waits.

The lock files live in `session-locks/` beside the database (0700, files 0600: a session id is
not secret, but nothing of ours in the data folder is readable by others).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from .errors import InvalidArgument, SessionBusy, StoreError

log = logging.getLogger(__name__)

LOCKS_DIR: Final = "session-locks"
_PRIVATE_DIR_MODE: Final = 0o700
_PRIVATE_FILE_MODE: Final = 0o600
_SAFE_ID: Final = re.compile(r"[A-Za-z0-9_-]+")
"""Session ids become file names: uuid hex in practice; nothing that could leave the folder."""
_HOLDER: Final = re.compile(r"pid (\d+)")


def lock_path(database: Path, session_id: str) -> Path:
    """The lock file of `session_id` for the database at `database`."""
    if not isinstance(session_id, str) or not _SAFE_ID.fullmatch(session_id):
        raise InvalidArgument(f"not a session id: {session_id!r}")
    return database.parent / LOCKS_DIR / f"{session_id}.lock"


@contextmanager
def hold(
    path: Path,
    session_id: str,
    *,
    on_wait: Callable[[str], None] | None,
    cancel: threading.Event | None,
    poll_s: float,
) -> Iterator[None]:
    """Hold the exclusive lock on `path` for the body; see `SessionStore.writer`."""
    fd = _open_lock_file(path)
    try:
        if not _try_lock(fd):
            _wait_for_lock(fd, path, session_id, on_wait, cancel, poll_s)
        _write_holder(fd)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield
    finally:
        _release(fd)


def remove(path: Path) -> None:
    """Remove a session's lock file (its session is deleted); absent is fine."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:  # a leftover empty file costs nothing
        log.warning("session store: cannot remove the lock file %s: %s", path, exc.strerror)


def _open_lock_file(path: Path) -> int:
    try:
        path.parent.mkdir(mode=_PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _PRIVATE_FILE_MODE)
    except OSError as exc:
        raise StoreError(f"cannot create the session lock {path}: {exc.strerror}") from exc
    try:
        os.fchmod(fd, _PRIVATE_FILE_MODE)  # the open mode went through the umask
    except OSError:
        log.debug("session store: cannot chmod %s", path, exc_info=True)
    return fd


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_for_lock(
    fd: int,
    path: Path,
    session_id: str,
    on_wait: Callable[[str], None] | None,
    cancel: threading.Event | None,
    poll_s: float,
) -> None:
    """Poll (never block in `flock`, so a cancel is seen) until the lock is ours or `cancel` is
    set; `on_wait` hears once who holds it."""
    holder = describe_holder(path)
    log.info("session store: session %s is held by %s; waiting", session_id, holder)
    if on_wait is not None:
        on_wait(holder)
    while True:
        if cancel is not None and cancel.is_set():
            raise SessionBusy(f"session {session_id[:12]} is being written by {holder}; nothing was written")
        if cancel is not None:
            cancel.wait(poll_s)
        else:
            time.sleep(poll_s)
        if _try_lock(fd):
            return


def describe_holder(path: Path) -> str:
    """Who holds the lock, as far as its file says: "process 1234" ("process 1234 (this one)"
    for another thread of ours), or "another process" (the holder has not written its pid yet,
    or the file cannot be read)."""
    try:
        found = _HOLDER.match(path.read_text(encoding="ascii", errors="replace"))
    except OSError:
        found = None
    if found is None:
        return "another process"
    pid = int(found.group(1))
    return f"process {pid} (this one)" if pid == os.getpid() else f"process {pid}"


def _write_holder(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode("ascii"), 0)
    except OSError:  # only a name for waiters: the lock itself is held
        log.debug("session store: cannot write the lock holder", exc_info=True)


def _release(fd: int) -> None:
    """Clear the holder's name, then unlock (closing the descriptor unlocks too)."""
    try:
        os.ftruncate(fd, 0)
    except OSError:
        log.debug("session store: cannot clear the lock holder", exc_info=True)
    finally:
        os.close(fd)
