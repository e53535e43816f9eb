"""Write a file so that readers see the old version or the new one, never a torn one.

Profiles, settings, the default model and checkpoints all go through here: a temp file in the
same directory, flushed and fsynced, renamed over the target, and (for files whose loss would
cost a long recompute) the directory fsynced too, so the rename itself survives a power cut.

The result is 0600 whatever the umask (`mkstemp` already opens 0600, but through the umask; the
explicit `fchmod` makes the mode a promise): everything velo-chat writes is private to its user.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .config.locations import PRIVATE_FILE_MODE


def atomic_write(target: Path, write: Callable[[BinaryIO], object], *, sync_dir: bool = False) -> Path:
    """Call `write(fh)` on a temp file beside `target`, then put it in place atomically.

    If `write` raises, the temp file is removed and `target` is left as it was. The temp name
    carries the pid, so a cleaner can tell a dead writer's leftovers from a live one's."""
    target = Path(target)
    fd, tmp = _temp_beside(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), PRIVATE_FILE_MODE)
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return target


def atomic_produce(target: Path, produce: Callable[[Path], object]) -> Path:
    """`atomic_write` for a writer that takes a path, not a file (llama.cpp's quantizer):
    `produce(tmp)` fills a temp file beside `target`, which is then made private, fsynced and
    renamed into place; if `produce` raises, the temp file is removed."""
    target = Path(target)
    fd, tmp = _temp_beside(target)
    os.close(fd)
    try:
        produce(Path(tmp))
        with open(tmp, "rb") as fh:
            os.fchmod(fh.fileno(), PRIVATE_FILE_MODE)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _temp_beside(target: Path) -> tuple[int, str]:
    return tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.{os.getpid()}.", suffix=".tmp")


def atomic_write_text(target: Path, text: str) -> Path:
    return atomic_write(target, lambda fh: fh.write(text.encode("utf-8")))
