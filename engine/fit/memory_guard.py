"""The livelock guard after the load: on a machine whose GPU shares the RAM, what the engine
keeps growing while it runs (the checkpoints' RAM tier) asks before it grows.

The fit check refuses a load that would leave less than the margin available
(`machine.margin_bytes`, `report.FitReport.fits`), but memory moves after the load: other
programs start, and the RAM tier fills up to its budget one state at a time. There running out
does not fail a process, it stalls the machine until it is power cycled, so before the RAM
tier keeps another state it asks `MemoryGuard.admit`. Where keeping it would leave less than
the margin available, the guard drops the oldest states while that is enough, else the state
is not kept in RAM, with a warning that says the arithmetic and what to change.

Reading /proc/meminfo costs a system call and a parse; a save can come every few hundred
tokens, so the guard reads it at most once a second and, in between, subtracts what it let the
tier keep since (and adds back what it dropped). That errs on the safe side: a state is
allocated before it is offered, so a reading taken after its allocation counts it twice.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .machine import gpus, margin_bytes, meminfo
from .sizes import fmt

log = logging.getLogger(__name__)

READ_EVERY_S = 1.0  # /proc/meminfo is read at most this often


class MemoryGuard:
    """MemAvailable against a margin, read at most every `every_s` seconds.

    `meminfo_path` and `clock` are for tests (a file that says what a test wants, a clock it
    moves)."""

    def __init__(
        self,
        margin: int,
        *,
        meminfo_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = READ_EVERY_S,
    ) -> None:
        self.margin = margin
        self._path = meminfo_path
        self._clock = clock
        self._every = every_s
        self._read_at: float | None = None
        self._reading: int | None = None
        self._since = 0  # bytes kept (+) and dropped (-) since the reading
        self._lock = threading.Lock()

    def available(self) -> int | None:
        """MemAvailable as of the last reading, less what was kept since; None when
        /proc/meminfo cannot be read (nothing is refused then)."""
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._every:
                mem = meminfo(self._path)
                self._reading = mem.available if mem.total else None
                self._read_at, self._since = now, 0
            return None if self._reading is None else self._reading - self._since

    def allows(self, nbytes: int) -> bool:
        """Whether `nbytes` more leave at least the margin available."""
        left = self.available()
        return left is None or left - nbytes >= self.margin

    def took(self, nbytes: int) -> None:
        """`nbytes` were kept (negative: freed) since the last reading."""
        with self._lock:
            self._since += nbytes

    def admit(
        self, nbytes: int, held: Callable[[], Sequence[tuple[str, int]]], drop: Callable[[str], None]
    ) -> bool:
        """May a tier keep `nbytes` more? `held()` lists what it holds, (key, bytes) oldest
        first, and `drop(key)` frees one; the list is asked for only when memory is short (for
        a tier of shared chunks it costs a pass over every entry's chunks, and the tier asks
        from the turn's thread). When keeping the new state would leave less than the margin,
        the oldest states go while that is enough (the newest covers the most of the
        conversation); when even all of them would not be, nothing is dropped and the answer is
        no, with a warning. Counts what it admits and drops (a dropped state that a queued
        disk write still holds frees nothing until the write ends: the next reading sees that)."""
        if self.allows(nbytes):
            self.took(nbytes)
            return True
        left = self.available() or 0
        states = held()
        if not self.allows(nbytes - sum(size for _, size in states)):
            log.warning(
                "a checkpoint of %s was not kept in RAM: %s is available and %s must stay free "
                "on this machine (its GPU shares the RAM, and running out stalls it); lower "
                "checkpoints.ram_budget_mib or close other programs",
                fmt(nbytes),
                fmt(left),
                fmt(self.margin),
            )
            return False
        dropped = 0
        for key, size in states:
            drop(key)
            self.took(-size)
            dropped += 1
            if self.allows(nbytes):
                break
        log.info(
            "dropped %d older checkpoint(s) from RAM: %s was available and %s must stay free",
            dropped,
            fmt(left),
            fmt(self.margin),
        )
        self.took(nbytes)
        return True


@functools.cache
def machine_guard() -> MemoryGuard | None:
    """The guard for this machine, made on first use (one `nvidia-smi` call); None where the
    GPU does not share the RAM (or there is none): there memory is the budgets' business."""
    found = gpus()
    if not (found and found[0].integrated):
        return None
    return MemoryGuard(margin_bytes(meminfo().total))
