"""Content-defined chunks of a sequence state, so that a later save stores only what changed.

A state (`llama_state_seq_get_data_ext`) lays out the KV cache per layer, K then V, cells in
order. A longer context of the same conversation shares long runs with a shorter one's, but not
at the same offsets: every layer's block grows, so everything after the first layer moves. Fixed
offsets would share nothing; cut points chosen by the content find the shared runs wherever they
sit.

The cut points come from a rolling hash over the state read as 16-bit words (every KV cache type
of llama.cpp has an even row size, and the recurrent state is f32, so the blocks only ever move
by whole words): the sum of a random 32-bit value per word over a window of `WINDOW` words,
computed for every position at once with a cumulative sum (numpy, in blocks, so that a state of
gigabytes needs a few MiB of scratch). A position whose hash has its low `MASK_BITS` bits zero
is a candidate; chunks are then kept between `MIN_CHUNK` and `MAX_CHUNK` bytes. A pure-Python
byte loop would take minutes on a state of hundreds of MB; this runs at hundreds of MB/s.

A chunk is named by its SHA-256: two states that hold the same run hold the same chunks, stored
once (`ChunkedState`, the RAM tier's pool, the disk tier's packs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

WINDOW = 32
"""Words the rolling hash covers: a cut depends on the 64 bytes before it only."""
MASK_BITS = 11
"""A candidate cut every 2**11 words (4 KiB) on average: small enough that the runs a follow-up
shares with the state before it (a layer's cells, a few KiB each on a small model) are found."""
MIN_CHUNK = 2 << 10
MAX_CHUNK = 64 << 10
_BLOCK_WORDS = 1 << 18
"""Words hashed per numpy pass (at most a few MiB of scratch, whatever the state's size)."""
_GEAR_SEED = 0x5E10C4A7
"""Fixed: the cut points (and so the chunks shared between saves, on disk across versions)
depend on this table; changing it only costs sharing with files written before."""


def _gear() -> np.ndarray:
    return (
        np.random.default_rng(_GEAR_SEED).integers(0, 2**32, size=1 << 16, dtype=np.uint64).astype(np.uint32)
    )


_GEAR = _gear()


def _candidates(words: np.ndarray) -> np.ndarray:
    """Word indices after which the content allows a cut (sorted)."""
    mask = np.uint32((1 << MASK_BITS) - 1)
    found = []
    for start in range(0, len(words), _BLOCK_WORDS):
        lo = max(0, start - (WINDOW - 1))  # the window reaches back into the previous block
        sums = np.cumsum(_GEAR[words[lo : start + _BLOCK_WORDS]], dtype=np.uint32)
        if len(sums) < WINDOW:
            continue
        window = sums[WINDOW - 1 :].copy()
        window[1:] -= sums[:-WINDOW]
        idx = np.flatnonzero((window & mask) == 0) + (WINDOW - 1 + lo)
        found.append(idx[idx >= start])
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def cut_points(data: Any) -> list[int]:
    """End offsets of the chunks of `data` (bytes-like), the last one `len(data)`."""
    view = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    n = len(view)
    words = view[: n - n % 2].view("<u2")
    cuts: list[int] = []
    last = 0
    for word in _candidates(words).tolist():
        end = 2 * (word + 1)
        if end - last < MIN_CHUNK:
            continue
        while end - last > MAX_CHUNK:
            last += MAX_CHUNK
            cuts.append(last)
        if end - last >= MIN_CHUNK:
            cuts.append(end)
            last = end
    while n - last > MAX_CHUNK:
        last += MAX_CHUNK
        cuts.append(last)
    if n > last or not cuts:
        cuts.append(n)
    return cuts


def digest(chunk: Any) -> bytes:
    return hashlib.sha256(chunk).digest()


@dataclass(frozen=True)
class ChunkedState:
    """A state as its chunks, in order: each `chunks[i]` is a uint8 array whose SHA-256 is
    `digests[i]`. Arrays may be shared with other states (the RAM tier's pool)."""

    chunks: tuple[np.ndarray, ...]
    digests: tuple[bytes, ...]

    def __len__(self) -> int:
        return sum(len(c) for c in self.chunks)

    def assemble(self) -> np.ndarray:
        """One contiguous array of the whole state (what llama.cpp reads)."""
        return np.concatenate(self.chunks) if self.chunks else np.empty(0, dtype=np.uint8)


def split(state: Any, pool: dict[bytes, np.ndarray] | None = None) -> ChunkedState:
    """Cut `state` into chunks. Without a `pool` the chunks are views of `state` (nothing is
    copied: the disk writer holds the state anyway). With one (digest -> array), a chunk already
    there is that array and a new one a copy added to it, so that `state` itself can be
    released and states share their common chunks."""
    view = np.frombuffer(memoryview(state).cast("B"), dtype=np.uint8)
    chunks: list[np.ndarray] = []
    digests: list[bytes] = []
    start = 0
    for end in cut_points(view):
        piece = view[start:end]
        d = digest(piece)
        known = pool.get(d) if pool is not None else None
        if known is None:
            known = piece
            if pool is not None:
                known = pool[d] = piece.copy()
        chunks.append(known)
        digests.append(d)
        start = end
    return ChunkedState(tuple(chunks), tuple(digests))


def whole_digest(parts: Sequence[bytes]) -> str:
    """The digest of a chunked state: SHA-256 over its chunks' SHA-256 digests, in order."""
    return "sha256-chunks:" + hashlib.sha256(b"".join(parts)).hexdigest()


def new_bytes(state: ChunkedState, known: set[bytes]) -> int:
    """Bytes of `state` in chunks not in `known` (what a save of it writes)."""
    seen = set(known)
    total = 0
    for d, c in zip(state.digests, state.chunks, strict=True):
        if d not in seen:
            seen.add(d)
            total += len(c)
    return total
