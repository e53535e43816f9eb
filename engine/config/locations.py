"""Where velo-chat keeps its files, in one place.

Every directory is created on first use by the function that returns it; nothing here touches the
disk at import time. `VELO_CHAT_HOME` puts all of them under one folder (the tests use it);
otherwise they are the platformdirs user directories for "velo-chat".

Privacy: conversations hold code and secrets, and a shared machine is common, so every folder
velo-chat creates is 0700 and every file it writes 0600, whatever the umask (docs/privacy-and-input.md).
The modes are set on the file descriptor or the new folder itself, never by changing the process
umask: the umask is process-wide and the TUI writes from several threads, so a temporary umask
would leak into whatever another thread creates meanwhile.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

import platformdirs

log = logging.getLogger(__name__)

APP_NAME = "velo-chat"
HOME_ENV = "VELO_CHAT_HOME"
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def _home() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def tighten(path: Path, mode: int) -> bool:
    """Take away the permission bits of `path` that `mode` lacks, if it is ours; True if it
    changed.

    Why: files and folders made by an older velo-chat (or by hand) under umask 022 are readable
    by every user; tightening them when we open them fixes existing installs, not only new ones.
    Something owned by another user is left alone (chmod would fail, and it is not ours)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    current = stat.S_IMODE(st.st_mode)
    if not current & ~mode or st.st_uid != os.geteuid():
        return False
    try:
        os.chmod(path, current & mode)
    except OSError as exc:
        log.warning("cannot tighten the permissions of %s (%o): %s", path, current, exc.strerror)
        return False
    log.info("tightened %s from %o to %o", path, current, current & mode)
    return True


def private_dir(path: Path) -> Path:
    """`mkdir -p path`, but every folder this call creates is 0700 whatever the umask, and `path`
    itself, if it already existed, loses its group/other bits (`tighten`).

    Parents that already exist (`~/.config`, a `VELO_CHAT_HOME` the user picked) are not
    touched: they are not ours. `Path.mkdir(parents=True)` would create missing parents with
    the umask's mode, hence the walk."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR_MODE)
        except FileExistsError:
            continue  # another process made it first (and made it private too)
        os.chmod(folder, PRIVATE_DIR_MODE)  # mkdir's mode went through the umask
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    if not missing:
        tighten(path, PRIVATE_DIR_MODE)
    return path


def create_private(path: Path, flags: int) -> int:
    """`os.open(path, flags | O_CREAT)` where a file this call creates is 0600 whatever the
    umask; a file that already exists is opened as it is. Returns the descriptor.

    An existing file keeps its mode because it may be the user's own (`sessions export -o`
    onto a file they made); callers that own the file call `tighten` as well."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        return os.open(path, flags)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)  # the open mode went through the umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def config_dir() -> Path:
    """User profiles (`profiles/*.toml`) and settings."""
    home = _home()
    return private_dir(home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME)))


def data_dir() -> Path:
    """The session database and the embedded default model."""
    home = _home()
    return private_dir(home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME)))


def cache_dir() -> Path:
    """Checkpoints (the disk tier) and anything else that can be rebuilt."""
    home = _home()
    return private_dir(home / "cache" if home else Path(platformdirs.user_cache_dir(APP_NAME)))


def log_dir() -> Path:
    """`velo-chat.log`, including llama.cpp's own log lines."""
    home = _home()
    return private_dir(home / "logs" if home else Path(platformdirs.user_log_dir(APP_NAME)))


def models_dir() -> Path:
    return private_dir(data_dir() / "models")


def exports_dir() -> Path:
    """Where the TUI writes session exports (the CLI writes where `-o` says)."""
    return private_dir(data_dir() / "exports")


def user_profiles_dir() -> Path:
    return private_dir(config_dir() / "profiles")


def checkpoints_dir() -> Path:
    return private_dir(cache_dir() / "checkpoints")


def database_path() -> Path:
    return data_dir() / "sessions.sqlite3"


def log_path() -> Path:
    return log_dir() / "velo-chat.log"
