"""The session database's files are private: 0600 whatever the umask (docs/privacy-and-input.md).

Kept apart from the repository: it is about the file system, not about sessions.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

_PRIVATE_FILE_MODE = 0o600
_SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def private_database_file(path: Path) -> None:
    """Create the database file 0600 before SQLite opens it, and tighten ours if more open.

    SQLite gives the -wal, -shm and -journal files it creates the mode of the database file
    (and fchmods them to it, so the umask does not matter), so a 0600 database keeps its whole
    family 0600. Pre-creating the file, rather than setting a umask around `connect`, because
    the umask is process-wide and the TUI's other threads create files meanwhile. A zero-length
    file is a valid empty SQLite database."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _PRIVATE_FILE_MODE)
    except FileExistsError:
        pass
    else:
        try:
            os.fchmod(fd, _PRIVATE_FILE_MODE)  # the open mode went through the umask
        finally:
            os.close(fd)
    for suffix in _SQLITE_SIDE_FILES:
        member = Path(f"{path}{suffix}")
        try:
            st = member.stat()
            mode = stat.S_IMODE(st.st_mode)
            if mode & ~_PRIVATE_FILE_MODE and st.st_uid == os.geteuid():
                os.chmod(member, mode & _PRIVATE_FILE_MODE)
                log.info("session store: tightened %s from %o to 600", member, mode)
        except FileNotFoundError:
            continue
        except OSError as exc:  # a read-only mount: still usable, just not tightened
            log.warning("session store: cannot tighten %s: %s", member, exc.strerror)
