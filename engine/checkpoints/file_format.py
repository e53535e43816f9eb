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
(`chunks.whole_digest`), and `state_sha256` the whole state's `payload_digest`. Reading one back
is `chunked_read.py`.
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
    return digest_of_blocks(parts)


def block_count(n_bytes: int) -> int:
    """How many `CHUNK` blocks `payload_digest` hashes for a payload of `n_bytes` (an empty
    payload is one empty block)."""
    return max(1, -(-n_bytes // CHUNK))


def digest_of_blocks(parts: list[bytes]) -> str:
    """`payload_digest` from its blocks' SHA-256 digests, in order (a reader that hashes each
    block as soon as it is in combines them here)."""
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
