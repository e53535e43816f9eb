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

Files are written to a temp file in the same directory, fsynced, then renamed: a reader sees a
whole checkpoint or none. JSON, not pickle: loading a file can never run code.
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
SUFFIX = ".vckpt"
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

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "model_fingerprint": self.model_fingerprint,
                "layout": self.layout,
                "n_tokens": self.n_tokens,
                "tokens_sha256": self.tokens_sha256,
                "payload_bytes": self.payload_bytes,
                "payload_sha256": self.payload_sha256,
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
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CheckpointInvalid(f"unreadable header ({exc})") from None


def file_size_for(n_tokens: int, payload_bytes: int, header_len: int = 512) -> int:
    """An upper estimate of the file size (for the budget check before writing)."""
    return _FIXED.size + header_len + 4 * n_tokens + payload_bytes


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
    the engine must not wait for all of it)."""
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
        if version != FORMAT_VERSION:
            raise CheckpointInvalid(f"format version {version}, expected {FORMAT_VERSION}")
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
        if header.payload_bytes != rest - 4 * header.n_tokens:
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
