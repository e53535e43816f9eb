"""The RAM tier of prefix checkpoints (an LRU under a byte budget, its states sharing chunks),
and the two rules both tiers choose a candidate by: how much of a turn's tokens a checkpoint
stands for (`usable_prefix`) and which of several wins (`preference`).

A state enters whole (`put`, on the engine's thread: a snapshot is kept as llama.cpp gave it,
nothing more is done before the reply). Later, off that thread, it is replaced by its
content-defined chunks (`chunks.py`) interned in a pool shared by every entry (`adopt`): the
states of one conversation share most of their KV cells, so ten follow-ups at 128K hold one
state and ten deltas instead of ten whole states. Who cuts the chunks is `Checkpoints`'
choice: the disk writer cuts them anyway and hands them over; without a disk tier this tier's
own background thread (`compact_later`) does. A restore assembles a chunked state into one
buffer (what llama.cpp reads).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import chunks as ch

if TYPE_CHECKING:
    from ..fit.memory_guard import MemoryGuard

log = logging.getLogger(__name__)


def usable_prefix(ckpt_tokens: np.ndarray, tokens: np.ndarray, *, exact: bool) -> int:
    """How many leading tokens of `tokens` a checkpoint can stand for (0 = none).

    At least one token of `tokens` must be left to decode (its logits start the reply)."""
    n = len(ckpt_tokens)
    limit = len(tokens) - 1
    if exact:
        if n == 0 or n > limit or not np.array_equal(ckpt_tokens, tokens[:n]):
            return 0
        return n
    m = min(n, limit)
    if m <= 0:
        return 0
    diff = np.flatnonzero(ckpt_tokens[:m] != tokens[:m])
    return int(diff[0]) if diff.size else m


def preference(n_usable: int, state_bytes: int, n_saved: int, name: str) -> tuple[int, int, int, str]:
    """Sort key of a candidate checkpoint, best first.

    The most usable tokens win. On an attention model several checkpoints often tie (a state
    saved after the prompt and one saved after the reply both cover the prompt minus its last
    token): then the smaller state wins, because a restore copies (and, from disk, reads and
    checksums) the whole state; then the one with fewer saved tokens (less to truncate); then the
    name, so that the choice never depends on the order of a dict, a directory listing or the
    LRU list."""
    return (-n_usable, state_bytes, n_saved, name)


@dataclass
class RamEntry:
    tokens: np.ndarray
    state: np.ndarray | ch.ChunkedState  # whole until it is chunked, then its pooled chunks
    key: str

    @property
    def whole(self) -> bool:
        return isinstance(self.state, np.ndarray)

    def contiguous(self) -> np.ndarray:
        """The state as one buffer: the array itself, or its chunks assembled (a copy)."""
        return self.state if isinstance(self.state, np.ndarray) else self.state.assemble()


class ChunkPool:
    """Chunks by digest, each held once with the number of entries that list it."""

    def __init__(self) -> None:
        self.arrays: dict[bytes, np.ndarray] = {}
        self.refs: dict[bytes, int] = {}
        self.bytes = 0

    def intern(self, state: ch.ChunkedState, copies: dict[bytes, np.ndarray]) -> tuple[ch.ChunkedState, int]:
        """`state` with every chunk the pool's array (a new one from `copies`, or copied now);
        also the bytes the pool grew by."""
        grown = 0
        arrays = []
        for d, piece in zip(state.digests, state.chunks, strict=True):
            held = self.arrays.get(d)
            if held is None:
                held = self.arrays[d] = copies[d] if d in copies else piece.copy()
                self.refs[d] = 0
                grown += len(held)
            self.refs[d] += 1
            arrays.append(held)
        self.bytes += grown
        return ch.ChunkedState(tuple(arrays), state.digests), grown

    def release(self, state: ch.ChunkedState) -> int:
        """Forget one entry's references; the bytes freed."""
        freed = 0
        for d in state.digests:
            self.refs[d] -= 1
            if self.refs[d] == 0:
                del self.refs[d]
                freed += len(self.arrays.pop(d))
        self.bytes -= freed
        return freed

    def only_in(self, state: ch.ChunkedState) -> int:
        """Bytes that dropping `state` alone would free (its chunks no other entry lists)."""
        own = collections.Counter(state.digests)
        return sum(len(self.arrays[d]) for d, n in own.items() if self.refs.get(d, 0) == n)


@dataclass(frozen=True)
class Adopted:
    """What chunking one entry did: its state's bytes and what the pool grew by for it."""

    key: str
    state_bytes: int
    new_bytes: int


class RamTier:
    def __init__(self, budget_bytes: int, guard: MemoryGuard | None = None, *, chunked: bool = True) -> None:
        """`guard`: asked before the tier grows (default: this machine's, which exists only
        where the GPU shares the RAM: engine/fit/memory_guard.py). `chunked`: whether entries
        are replaced by pooled chunks (`adopt`)."""
        self.budget = budget_bytes
        self.chunked = chunked
        self.entries: collections.OrderedDict[str, RamEntry] = collections.OrderedDict()
        self.pool = ChunkPool()
        self.whole_bytes = 0  # entries not chunked yet
        self.last_adopted: Adopted | None = None
        self._lock = threading.RLock()  # the engine's thread and the chunking thread
        self._jobs: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._unfinished = 0  # keys given to the background thread and not done yet
        self._settled = threading.Condition(self._lock)
        self._compactor: threading.Thread | None = None
        if guard is None:
            from ..fit.memory_guard import machine_guard  # (engine/fit imports the engine)

            guard = machine_guard()
        self.guard = guard

    @property
    def used(self) -> int:
        """Bytes the tier holds: whole entries, and every pooled chunk once."""
        return self.whole_bytes + self.pool.bytes

    def put(self, key: str, tokens: np.ndarray, state: np.ndarray) -> bool:
        size = len(state)
        if size > self.budget:
            return False
        with self._lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                return True
            while self.used + size > self.budget and self.entries:
                self.drop(next(iter(self.entries)))
        if self.guard is not None and not self.guard.admit(size, self._held, self.drop):
            return False  # the memory the machine must keep free: skipped, with a warning
        with self._lock:
            self.entries[key] = RamEntry(tokens, state, key)
            self.whole_bytes += size
        return True

    def _held(self) -> list[tuple[str, int]]:
        """(key, bytes dropping it alone would free), oldest first: what the memory guard may
        drop. A pass over every chunked entry's chunks, so the guard asks only when memory is
        short, never on every save."""
        with self._lock:
            return [(k, self._freeable(e)) for k, e in self.entries.items()]

    def _freeable(self, entry: RamEntry) -> int:
        return len(entry.state) if entry.whole else self.pool.only_in(entry.state)  # type: ignore[arg-type]

    def holds_whole(self, key: str) -> bool:
        """Whether `key`'s entry is still the array it was put as (one a queued disk write of
        the same state shares)."""
        with self._lock:
            entry = self.entries.get(key)
            return entry is not None and entry.whole

    def adopt(self, key: str, state: ch.ChunkedState) -> Adopted | None:
        """Replace `key`'s whole state by `state`'s chunks, interned in the pool (new ones
        copied, so the whole array can go). None if the entry is gone or already chunked.
        Runs off the engine's thread: the copies are made before the lock is taken."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is None or not entry.whole or not self.chunked:
                return None
            known = set(self.pool.arrays)
        copies = {d: c.copy() for d, c in zip(state.digests, state.chunks, strict=True) if d not in known}
        with self._lock:
            entry = self.entries.get(key)
            if entry is None or not entry.whole:
                return None
            size = len(entry.state)
            entry.state, grown = self.pool.intern(state, copies)
            self.whole_bytes -= size
            self.last_adopted = Adopted(key, size, grown)
        return self.last_adopted

    def compact_later(self, key: str) -> None:
        """Chunk `key`'s entry on this tier's background thread (where no disk writer does)."""
        if not self.chunked:
            return
        with self._lock:
            self._unfinished += 1
            self._jobs.put(key)
            if self._compactor is None or not self._compactor.is_alive():
                self._compactor = threading.Thread(
                    target=self._compact_loop, name="velo-ckpt-ram", daemon=True
                )
                self._compactor.start()

    def _compact_loop(self) -> None:
        from .tiers import background_priority

        background_priority()
        while (key := self._jobs.get()) is not None:
            with self._lock:
                entry = self.entries.get(key)
                state = entry.state if entry is not None and entry.whole else None
            try:
                if state is not None:
                    self.adopt(key, ch.split(state))
            except Exception:  # the entry stays whole: memory, never correctness
                log.exception("could not chunk a RAM checkpoint")
            finally:
                del state
                with self._lock:
                    self._unfinished -= 1
                    self._settled.notify_all()

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until the background thread has chunked what it was given (benchmarks, tests);
        False if `timeout` passed first."""
        with self._lock:
            return self._settled.wait_for(lambda: self._unfinished == 0, timeout)

    def close(self) -> None:
        with self._lock:
            worker, self._compactor = self._compactor, None
        if worker is not None and worker.is_alive():
            self._jobs.put(None)
            worker.join(5.0)

    def best(self, tokens: np.ndarray, *, exact: bool) -> tuple[int, RamEntry | None]:
        """The entry covering the longest usable prefix of `tokens`, ties by `preference`."""
        best_key, best = None, None
        with self._lock:
            entries = list(self.entries.values())
        for entry in entries:
            n = usable_prefix(entry.tokens, tokens, exact=exact)
            if n == 0:
                continue
            key = preference(n, len(entry.state), len(entry.tokens), entry.key)
            if best_key is None or key < best_key:
                best_key, best = key, entry
        return (-best_key[0], best) if best_key is not None else (0, None)

    def touch(self, key: str) -> None:
        with self._lock:
            if key in self.entries:
                self.entries.move_to_end(key)

    def drop(self, key: str) -> None:
        with self._lock:
            entry = self.entries.pop(key, None)
            if entry is None:
                return
            if entry.whole:
                self.whole_bytes -= len(entry.state)
            else:
                self.pool.release(entry.state)  # type: ignore[arg-type]
