"""Reading a chunked checkpoint (format 3, `file_format.py`) back into one buffer, fast and
verified: the packs are read at once, each in offset order, and the whole state is checked
against its block digest on every core while it is read, chunk by chunk only when that fails.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .file_format import (
    CHUNK,
    CheckpointInvalid,
    ChunkDamaged,
    block_count,
    digest_of_blocks,
    digests_of,
    pack_path,
    packs_of,
)


@dataclass(frozen=True)
class _Run:
    """Consecutive chunks of a table that also follow each other in one pack: one read."""

    pack: bytes
    offset: int  # in the pack
    start: int  # in the payload
    length: int
    first: int  # chunk indices [first, stop)
    stop: int


def _runs(table: np.ndarray) -> list[_Run]:
    """The table's runs, in payload order."""
    n = len(table)
    if n == 0:
        return []
    lengths = table["length"].astype(np.int64)
    offsets = table["offset"].astype(np.int64)
    packs = table["pack"]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    breaks = np.ones(n, dtype=bool)
    breaks[1:] = (packs[1:] != packs[:-1]) | (offsets[1:] != offsets[:-1] + lengths[:-1])
    firsts = np.flatnonzero(breaks)
    stops = np.append(firsts[1:], n)
    ids = packs_of(table)  # whole ids: numpy drops an `S` field's trailing NUL bytes
    return [
        _Run(ids[f], int(offsets[f]), int(starts[f]), int(ends[e - 1] - starts[f]), int(f), int(e))
        for f, e in zip(firsts.tolist(), stops.tolist(), strict=True)
    ]


class ChunkedPayload:
    """The payload of a format-3 checkpoint, read from its packs into one array and verified
    (on every core: this is on the way to a reply's first token).

    A file with `state_sha256` is verified as a format-2 file is: the whole state's
    `payload_digest`, 16 MiB blocks hashed in parallel. Only when that does not match are the
    chunks checked one by one, to name the damaged chunk (every checkpoint that lists it must
    go). Hashing each 4 KiB chunk from Python costs several times more than the blocks, so
    files without it (written before it existed) are checked chunk by chunk while they are read.

    The packs are read at once (`READERS`), each in its own order (its runs sorted by offset,
    after telling the kernel which ranges will be read, so that it reads ahead), with `pread`
    into the run's place in the buffer (a run in one call: smaller reads of a pack that is not
    in the page cache made the restore slower and less even). Worker threads hash what is in as
    soon as it is: each 16 MiB block of the whole state once its last byte has arrived
    (`_Blocks`), or the chunks of each batch of runs. The restore then takes about the longer
    of the read and the hashing, not their sum."""

    READERS = 4
    """Packs read at once: a restore's chunks sit in several packs, and a disk serves
    concurrent reads faster than one after the other."""
    VERIFY_BATCH = 4 << 20
    """Bytes of chunks one verify task hashes, about (a task per 4 KiB chunk would cost more in
    scheduling than in hashing)."""

    def __init__(
        self,
        directory: Path,
        table: np.ndarray,
        payload_bytes: int,
        threads: int | None = None,
        *,
        state_sha256: str = "",
    ) -> None:
        buf = np.empty(payload_bytes, dtype=np.uint8)
        ends = np.cumsum(table["length"], dtype=np.int64).tolist()
        digests = digests_of(table)
        workers = threads or max(1, len(os.sched_getaffinity(0)))
        by_pack: dict[bytes, list[_Run]] = {}
        for run in _runs(table):
            by_pack.setdefault(run.pack, []).append(run)

        def bad_in(ranges: list[tuple[int, int]]) -> bytes | None:
            for lo, hi in ranges:
                start = ends[lo - 1] if lo else 0
                for i in range(lo, hi):
                    if hashlib.sha256(buf.data[start : ends[i]]).digest() != digests[i]:
                        return bytes(digests[i])
                    start = ends[i]
            return None

        tasks: list[Any] = []  # appended to by the readers (list.append is atomic)
        with ThreadPoolExecutor(max_workers=workers) as hashers:
            blocks = _Blocks(buf, hashers) if state_sha256 else None

            def each_batch(ranges: list[tuple[int, int]]) -> None:
                if not state_sha256:  # no whole-state digest: the chunks are the check
                    tasks.append(hashers.submit(bad_in, ranges))

            def each_read(start: int, length: int) -> None:
                if blocks is not None:
                    blocks.arrived(start, length)

            readers = ThreadPoolExecutor(max_workers=min(len(by_pack), self.READERS) or 1)
            reads: list[Any] = []
            try:
                reads = [
                    readers.submit(
                        self._read_pack,
                        directory,
                        table,
                        pack,
                        sorted(runs, key=lambda r: r.offset),
                        buf,
                        each_batch,
                        each_read,
                    )
                    for pack, runs in by_pack.items()
                ]
                for r in reads:
                    r.result()  # a missing or short pack raises here
            except BaseException:
                for t in [*reads, *tasks, *(blocks.hashing if blocks else [])]:
                    t.cancel()
                raise
            finally:
                readers.shutdown(wait=True)
            if blocks is not None and blocks.digest() != state_sha256:
                step = max(1, len(digests) // workers)
                tasks = [
                    hashers.submit(bad_in, [(i, min(i + step, len(digests)))])
                    for i in range(0, len(digests), step)
                ]
                if not any(t.result() for t in tasks):
                    raise CheckpointInvalid("payload checksum mismatch (the state, not a chunk)")
            found = [t.result() for t in tasks]
        bad = next((d for d in found if d is not None), None)
        if bad is not None:
            raise ChunkDamaged(f"payload checksum mismatch (chunk {bad.hex()[:12]})", bad)
        self.view = buf.data

    @classmethod
    def _read_pack(
        cls,
        directory: Path,
        table: np.ndarray,
        pack: bytes,
        runs: list[_Run],
        buf: np.ndarray,
        verify: Callable[[list[tuple[int, int]]], None],
        arrived: Callable[[int, int], None],
    ) -> None:
        """Read one pack's `runs` (sorted by offset) into `buf`, handing their chunk ranges to
        `verify` in batches of about VERIFY_BATCH bytes, and each read (its place in the
        payload and its length) to `arrived`."""
        try:
            fd = os.open(pack_path(directory, pack), os.O_RDONLY)
        except FileNotFoundError:
            raise ChunkDamaged(f"chunk pack {pack.hex()} is missing", cls._first(table, pack)) from None
        batch: list[tuple[int, int]] = []
        batch_bytes = 0
        try:
            if hasattr(os, "posix_fadvise"):
                for run in runs:
                    os.posix_fadvise(fd, run.offset, run.length, os.POSIX_FADV_WILLNEED)
            for run in runs:
                got = 0
                while got < run.length:  # pread may return less than asked
                    n = os.preadv(fd, [buf.data[run.start + got : run.start + run.length]], run.offset + got)
                    if n == 0:
                        raise ChunkDamaged(f"chunk pack {pack.hex()} is truncated", cls._first(table, pack))
                    arrived(run.start + got, n)
                    got += n
                batch.append((run.first, run.stop))
                batch_bytes += run.length
                if batch_bytes >= cls.VERIFY_BATCH:
                    verify(batch)
                    batch, batch_bytes = [], 0
            if batch:
                verify(batch)
        finally:
            os.close(fd)

    @staticmethod
    def _first(table: np.ndarray, pack: bytes) -> bytes:
        """The first chunk the table lists in `pack` (what a missing pack damages)."""
        listed = (d for d, p in zip(digests_of(table), packs_of(table), strict=True) if p == pack)
        return next(listed, digests_of(table)[0])

    def close(self) -> None:
        self.view.release()

    def __enter__(self) -> ChunkedPayload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Blocks:
    """The whole state's `payload_digest`, computed while the payload is read: each 16 MiB
    block is hashed (on `hashers`) as soon as every byte of it has arrived, in whatever order
    the packs deliver them."""

    def __init__(self, buf: np.ndarray, hashers: ThreadPoolExecutor) -> None:
        self.buf = buf
        self.hashers = hashers
        n = block_count(len(buf))
        self.missing = [min(CHUNK, len(buf) - b * CHUNK) for b in range(n)]  # bytes still to come
        self.parts: list[Any] = [None] * n
        self.hashing: list[Any] = []
        self._lock = threading.Lock()
        if len(buf) == 0:
            self._hash(0)

    def arrived(self, start: int, length: int) -> None:
        """`length` bytes at `start` are in `buf` (each byte arrives once)."""
        done = []
        with self._lock:
            end = start + length
            for b in range(start // CHUNK, -(-end // CHUNK)):
                self.missing[b] -= min(end, (b + 1) * CHUNK) - max(start, b * CHUNK)
                if self.missing[b] == 0:
                    done.append(b)
        for b in done:
            self._hash(b)

    def _hash(self, b: int) -> None:
        block = self.buf.data[b * CHUNK : (b + 1) * CHUNK]
        self.parts[b] = self.hashers.submit(lambda: hashlib.sha256(block).digest())
        self.hashing.append(self.parts[b])

    def digest(self) -> str:
        """The digest of what was read (every byte must have arrived: the reads have ended)."""
        if any(self.missing):
            raise CheckpointInvalid("the chunk table does not cover the whole state")
        return digest_of_blocks([p.result() for p in self.parts])
