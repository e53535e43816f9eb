"""How much of a file range is in the page cache (`mincore(2)` on a read-only mapping of it), and
reading a range into it (`warm`).

The PLE table stays on lazy mmap; a bulk file copy can evict it, and decode then reads its rows
from disk. `resident` says how much of it is in memory now, without reading (or faulting in) a
byte; `warm` reads it in again, with progress.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PROT_READ, MAP_SHARED = 0x1, 0x01
MAP_FAILED = ctypes.c_void_p(-1).value
WARM_CHUNK = 16 << 20  # bytes read per call when warming
WARM_BELOW = 0.9  # below this share in the page cache, doctor and the live panel suggest warming


@dataclass(frozen=True)
class Residency:
    path: Path
    offset: int
    length: int
    resident: int  # bytes of the range in the page cache (whole pages)

    @property
    def fraction(self) -> float:
        return self.resident / self.length if self.length else 1.0

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "offset": self.offset,
            "bytes": self.length,
            "resident": self.resident,
            "fraction": round(self.fraction, 4),
        }


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return libc


def resident(path: Path, offset: int = 0, length: int | None = None) -> Residency:
    """Bytes of `path`[offset : offset+length] in the page cache (raises OSError)."""
    path = Path(path)
    size = path.stat().st_size
    length = size - offset if length is None else min(length, size - offset)
    if length <= 0:
        return Residency(path, offset, 0, 0)
    page = mmap.PAGESIZE
    start = offset // page * page
    span = offset + length - start
    n_pages = (span + page - 1) // page
    libc = _libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, span, PROT_READ, MAP_SHARED, fd, start)
        if addr is None or addr == MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap failed: {os.strerror(err)}", str(path))
        try:
            vec = (ctypes.c_ubyte * n_pages)()
            if libc.mincore(addr, span, vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore failed: {os.strerror(err)}", str(path))
        finally:
            libc.munmap(addr, span)
    finally:
        os.close(fd)
    flags = np.ctypeslib.as_array(vec) & 1
    total = int(np.count_nonzero(flags)) * page
    if flags[0]:  # the range starts inside its first page
        total -= offset - start
    if flags[-1]:  # and may end inside its last
        total -= start + n_pages * page - (offset + length)
    return Residency(path, offset, length, total)


def warm(
    path: Path,
    offset: int = 0,
    length: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    chunk: int = WARM_CHUNK,
) -> Residency:
    """Read `path`[offset : offset+length] into the page cache, chunk by chunk, reporting
    `on_progress(bytes_done, total)`; returns the residency afterwards.

    The kernel is told the range will be read once in order (`POSIX_FADV_SEQUENTIAL`: a large
    readahead) and wanted soon (`POSIX_FADV_WILLNEED`). The bytes are read into one reused
    buffer, so the process's own memory does not grow."""
    path = Path(path)
    size = path.stat().st_size
    length = size - offset if length is None else min(length, size - offset)
    fd = os.open(path, os.O_RDONLY)
    try:
        if length > 0:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_SEQUENTIAL)
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        buf = bytearray(min(chunk, max(length, 1)))
        view = memoryview(buf)
        done = 0
        while done < length:
            n = os.preadv(fd, [view[: min(len(buf), length - done)]], offset + done)
            if n <= 0:
                break
            done += n
            if on_progress is not None:
                on_progress(done, length)
    finally:
        os.close(fd)
    return resident(path, offset, length)


def drop_from_page_cache(paths: Iterable[Path]) -> bool:
    """Write `paths` out and ask the kernel to forget their pages, so that the next read comes
    from the disk (a first start, a restore from disk); False where that cannot be asked (no
    `posix_fadvise`)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True
