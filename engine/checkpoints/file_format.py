"""The checkpoint file format: a saved sequence state, never trusted before it is verified.

Layout (little-endian):

    8 bytes   magic b"VELOCKPT"
    u32       format version (1)
    u32       header length H
    H bytes   header, UTF-8 JSON: model fingerprint, the context parameters that change the
              state layout, token count, SHA-256 of the token prefix, payload length and its
              SHA-256 (`payload_sha256`, see `payload_digest`)
    4*n bytes the token prefix (int32), so longest-prefix lookup needs no model work
    payload   llama_state_seq_get_data_ext(ctx, ..., seq 0, flags 0): attention KV + recurrent

Format 3 (chunked, `CHUNKED_VERSION`, what the disk tier writes) keeps the same magic, header
and token prefix, but instead of the payload a table of its chunks (`chunks.py`), one
`TABLE_ENTRY` each: SHA-256 of the chunk, the pack file that holds it and where. A pack
(`<id>-<pid>.vpack`) is the chunks a save added, concatenated; a later save of the same
conversation writes only the chunks no pack of its directory holds yet. The header adds
`n_chunks`; its `payload_sha256` is SHA-256 over the chunk digests in order
(`chunks.whole_digest`), and every chunk is checked against its own digest when it is read.
Files of format 2 are still read and restored.

Files are written to a temp file in the same directory, fsynced, then renamed: a reader sees a
whole checkpoint or none (a manifest is renamed into place only after its pack is durable).
JSON, not pickle: loading a file can never run code.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..atomic_file import atomic_write

MAGIC = b"VELOCKPT"
FORMAT_VERSION = 2
CHUNKED_VERSION = 3
READABLE_VERSIONS = (FORMAT_VERSION, CHUNKED_VERSION)
SUFFIX = ".vckpt"
PACK_SUFFIX = ".vpack"
TABLE_ENTRY = np.dtype([("digest", "S32"), ("pack", "S16"), ("offset", "<u8"), ("length", "<u4")])
"""One chunk of a format-3 checkpoint: its SHA-256, the pack's id, offset and length there."""
_FIXED = struct.Struct("<8sII")
MAX_HEADER = 1 << 20


class CheckpointInvalid(ValueError):
    """A checkpoint failed a check (magic, version, header, tokens, checksum, identity)."""


class WriteAbandoned(Exception):
    """A write was told to stop (the engine is closing); its temp file is already gone."""


WRITE_CHUNK = 64 << 20
"""Payload bytes written between two checks of `should_stop` (well under a second of I/O)."""


CHUNK = 16 << 20


def payload_digest(data: Any, threads: int | None = None) -> str:
    """SHA-256 over the SHA-256 digests of the payload's 16 MiB chunks, hashed in parallel.

    A state is hundreds of MB and the check sits on the resume path (time to first token), where
    one SHA-256 stream would be the bottleneck, so the chunks are hashed on all usable cores
    (hashlib releases the GIL). Any changed byte still changes the digest."""
    view = memoryview(data).cast("B")
    chunks = [view[i : i + CHUNK] for i in range(0, len(view), CHUNK)] or [view]
    workers = threads or max(1, min(len(chunks), len(os.sched_getaffinity(0))))
    if workers == 1:
        parts = [hashlib.sha256(c).digest() for c in chunks]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(lambda c: hashlib.sha256(c).digest(), chunks))
    for c in chunks:
        c.release()
    view.release()
    return "sha256-16MiB:" + hashlib.sha256(b"".join(parts)).hexdigest()


def tokens_digest(tokens: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes()).hexdigest()


@dataclass(frozen=True)
class CheckpointHeader:
    model_fingerprint: str
    layout: dict[str, Any]  # state-affecting context parameters
    n_tokens: int
    tokens_sha256: str
    payload_bytes: int
    payload_sha256: str
    n_chunks: int = 0  # format 3: entries of the chunk table (0: format 2, the payload inline)
    state_sha256: str = ""  # format 3: `payload_digest` of the whole state ("": files before it)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "model_fingerprint": self.model_fingerprint,
                "layout": self.layout,
                "n_tokens": self.n_tokens,
                "tokens_sha256": self.tokens_sha256,
                "payload_bytes": self.payload_bytes,
                "payload_sha256": self.payload_sha256,
                **({"n_chunks": self.n_chunks} if self.n_chunks else {}),
                **({"state_sha256": self.state_sha256} if self.state_sha256 else {}),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> CheckpointHeader:
        try:
            d = json.loads(raw.decode("utf-8"))
            return cls(
                str(d["model_fingerprint"]),
                dict(d["layout"]),
                int(d["n_tokens"]),
                str(d["tokens_sha256"]),
                int(d["payload_bytes"]),
                str(d["payload_sha256"]),
                int(d.get("n_chunks") or 0),
                str(d.get("state_sha256") or ""),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CheckpointInvalid(f"unreadable header ({exc})") from None


def file_size_for(n_tokens: int, payload_bytes: int, header_len: int = 512) -> int:
    """An upper estimate of the file size (for the budget check before writing)."""
    return _FIXED.size + header_len + 4 * n_tokens + payload_bytes


@dataclass(frozen=True)
class ChunkedWrite:
    """The payload of a format-3 write: the chunks no pack holds yet (`pieces`, written to
    `pack` first) and the table of every chunk of the state."""

    pack: Path | None
    pieces: list[np.ndarray]
    table: np.ndarray
    payload_bytes: int

    def __len__(self) -> int:
        return self.payload_bytes

    @property
    def new_bytes(self) -> int:
        return sum(len(p) for p in self.pieces)


def write_checkpoint(
    directory: Path,
    name: str,
    header: CheckpointHeader,
    tokens: np.ndarray,
    payload: Any,
    should_stop: Callable[[], bool] | None = None,
) -> Path:
    """Write atomically (temp file, fsync, rename, fsync the directory); return the path.

    The payload goes out in `WRITE_CHUNK` pieces, asking `should_stop()` before each: if it
    says so, the temp file is removed and `WriteAbandoned` raised (a state is gigabytes; closing
    the engine must not wait for all of it). A `ChunkedWrite` writes its pack, then the
    format-3 file that lists its chunks."""
    if isinstance(payload, ChunkedWrite):
        if len(tokens) != header.n_tokens or len(payload) != header.payload_bytes:
            raise ValueError("checkpoint header does not describe its tokens and payload")
        if payload.pack is not None and payload.pieces:
            write_pack(payload.pack, payload.pieces, should_stop)
        elif should_stop is not None and should_stop():
            raise WriteAbandoned
        return write_manifest(directory, name, header, tokens, payload.table)
    if len(tokens) != header.n_tokens or len(payload) != header.payload_bytes:
        raise ValueError("checkpoint header does not describe its tokens and payload")
    raw = header.to_json()

    def write(fh: BinaryIO) -> None:
        fh.write(_FIXED.pack(MAGIC, FORMAT_VERSION, len(raw)))
        fh.write(raw)
        fh.write(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
        with memoryview(payload).cast("B") as view:
            for start in range(0, len(view), WRITE_CHUNK):
                if should_stop is not None and should_stop():
                    raise WriteAbandoned
                fh.write(view[start : start + WRITE_CHUNK])

    return atomic_write(directory / f"{name}{SUFFIX}", write, sync_dir=True)


def read_header(path: Path) -> tuple[CheckpointHeader, np.ndarray, int]:
    """Header, token prefix and payload offset; checks everything but the payload checksum."""
    with path.open("rb") as fh:
        fixed = fh.read(_FIXED.size)
        if len(fixed) != _FIXED.size:
            raise CheckpointInvalid("truncated (no header)")
        magic, version, header_len = _FIXED.unpack(fixed)
        if magic != MAGIC:
            raise CheckpointInvalid("not a velo-chat checkpoint (bad magic)")
        if version not in READABLE_VERSIONS:
            raise CheckpointInvalid(f"format version {version}, expected one of {READABLE_VERSIONS}")
        if header_len > MAX_HEADER:
            raise CheckpointInvalid("corrupt header length")
        raw = fh.read(header_len)
        if len(raw) != header_len:
            raise CheckpointInvalid("truncated header")
        header = CheckpointHeader.from_json(raw)
        # The header's sizes are checked against the file before anything is read with them: a
        # corrupt count must not become a read (an allocation) of gigabytes.
        rest = os.fstat(fh.fileno()).st_size - fh.tell()
        if not 0 <= 4 * header.n_tokens <= rest:
            raise CheckpointInvalid(
                f"the header's token count ({header.n_tokens:,}) does not fit in the file"
            )
        if (version == CHUNKED_VERSION) != (header.n_chunks > 0):
            raise CheckpointInvalid(f"a format {version} header with {header.n_chunks} chunks")
        table_bytes = TABLE_ENTRY.itemsize * header.n_chunks
        if version == CHUNKED_VERSION and table_bytes != rest - 4 * header.n_tokens:
            raise CheckpointInvalid(
                f"chunk table is {rest - 4 * header.n_tokens:,} bytes, "
                f"header says {table_bytes:,} (truncated?)"
            )
        if version == FORMAT_VERSION and header.payload_bytes != rest - 4 * header.n_tokens:
            raise CheckpointInvalid(
                f"payload is {rest - 4 * header.n_tokens:,} bytes, header says "
                f"{header.payload_bytes:,} (truncated?)"
            )
        token_bytes = fh.read(4 * header.n_tokens)
        if len(token_bytes) != 4 * header.n_tokens:
            raise CheckpointInvalid("truncated token prefix")
        tokens = np.frombuffer(token_bytes, dtype="<i4").astype(np.int32)
        if tokens_digest(tokens) != header.tokens_sha256:
            raise CheckpointInvalid("token prefix does not match its hash")
        offset = fh.tell()
    return header, tokens, offset


class MappedPayload:
    """The payload of a verified checkpoint, mapped copy-on-write (no read copy; llama.cpp
    copies it straight from the page cache into the context)."""

    def __init__(self, path: Path, offset: int, length: int, expected_sha256: str) -> None:
        with path.open("rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        view = memoryview(self._map)[offset : offset + length]
        if payload_digest(view) != expected_sha256:
            view.release()
            self._map.close()
            raise CheckpointInvalid("payload checksum mismatch")
        self.view = view

    def close(self) -> None:
        self.view.release()
        self._map.close()

    def __enter__(self) -> MappedPayload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def digests_of(table: np.ndarray) -> list[bytes]:
    """The chunk digests of a table, whole (numpy drops the trailing NUL bytes of an `S` field)."""
    return [d.ljust(32, b"\0") for d in table["digest"].tolist()]


def packs_of(table: np.ndarray) -> list[bytes]:
    """The pack ids of a table's chunks, whole."""
    return [p.ljust(16, b"\0") for p in table["pack"].tolist()]


def read_chunk_table(path: Path, header: CheckpointHeader, offset: int) -> np.ndarray:
    """The chunk table of a format-3 file whose header `read_header` checked; its digests must
    add up to the header's `payload_sha256` and its lengths to `payload_bytes`."""
    with path.open("rb") as fh:
        fh.seek(offset)
        raw = fh.read(TABLE_ENTRY.itemsize * header.n_chunks)
    if len(raw) != TABLE_ENTRY.itemsize * header.n_chunks:
        raise CheckpointInvalid("truncated chunk table")
    table = np.frombuffer(raw, dtype=TABLE_ENTRY)
    if int(table["length"].sum(dtype=np.uint64)) != header.payload_bytes:
        raise CheckpointInvalid("payload checksum mismatch (the chunk table does not add up to its size)")
    if table_digest(table) != header.payload_sha256:
        raise CheckpointInvalid("payload checksum mismatch (the chunk table does not match it)")
    return table


def table_digest(table: np.ndarray) -> str:
    """What a format-3 header's `payload_sha256` says: SHA-256 over the chunk digests in order."""
    return "sha256-chunks:" + hashlib.sha256(b"".join(digests_of(table))).hexdigest()


def write_manifest(
    directory: Path, name: str, header: CheckpointHeader, tokens: np.ndarray, table: np.ndarray
) -> Path:
    """Write a format-3 file (atomically, directory fsynced); its packs must be durable first."""
    if len(tokens) != header.n_tokens or len(table) != header.n_chunks or not header.n_chunks:
        raise ValueError("checkpoint header does not describe its tokens and chunk table")
    raw = header.to_json()

    def write(fh: BinaryIO) -> None:
        fh.write(_FIXED.pack(MAGIC, CHUNKED_VERSION, len(raw)))
        fh.write(raw)
        fh.write(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
        fh.write(np.ascontiguousarray(table, dtype=TABLE_ENTRY).tobytes())

    return atomic_write(directory / f"{name}{SUFFIX}", write, sync_dir=True)


def write_pack(path: Path, pieces: list[np.ndarray], should_stop: Callable[[], bool] | None = None) -> Path:
    """Write the new chunks of a save as one file (atomically, fsynced), asking `should_stop()`
    about every `WRITE_CHUNK` bytes; `WriteAbandoned` leaves no file behind."""

    def write(fh: BinaryIO) -> None:
        done_since_check = WRITE_CHUNK
        for piece in pieces:
            if done_since_check >= WRITE_CHUNK:
                if should_stop is not None and should_stop():
                    raise WriteAbandoned
                done_since_check = 0
            fh.write(piece.tobytes() if not piece.flags.c_contiguous else piece.data)
            done_since_check += len(piece)

    return atomic_write(path, write, sync_dir=True)


class ChunkDamaged(CheckpointInvalid):
    """A chunk of a format-3 checkpoint is missing or does not match its digest: every
    checkpoint that lists it is unusable."""

    def __init__(self, message: str, digest: bytes) -> None:
        super().__init__(message)
        self.digest = digest


def pack_path(directory: Path, pack: bytes) -> Path:
    """The file of pack `pack` (its 16-byte id) in a tier's directory."""
    matches = sorted(directory.glob(f"{pack.hex()}-*{PACK_SUFFIX}"))
    return matches[0] if matches else directory / f"{pack.hex()}-0{PACK_SUFFIX}"


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
    into the run's place in the buffer; worker threads hash the chunks of each batch of runs as
    soon as it is in, so the restore takes about the longer of the read and the hashing, not
    their sum."""

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

            def each_batch(ranges: list[tuple[int, int]]) -> None:
                if not state_sha256:  # no whole-state digest: the chunks are the check
                    tasks.append(hashers.submit(bad_in, ranges))

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
                    )
                    for pack, runs in by_pack.items()
                ]
                for r in reads:
                    r.result()  # a missing or short pack raises here
            except BaseException:
                for t in [*reads, *tasks]:
                    t.cancel()
                raise
            finally:
                readers.shutdown(wait=True)
            if state_sha256 and payload_digest(buf, threads) != state_sha256:
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
    ) -> None:
        """Read one pack's `runs` (sorted by offset) into `buf`, handing their chunk ranges to
        `verify` in batches of about VERIFY_BATCH bytes."""
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
