"""No full garbage collection while a reply streams.

A full collection (CPython's oldest generation) walks every object the process holds. With a long
session open that is the Textual widgets of every message, a few hundred thousand objects, and
one in the middle of a reply is a visible stall (docs/results/tui.md has one measured).
It runs on whichever thread happens to allocate, holding the GIL, so the decode stops for as long
as it takes, and the reply stalls on screen. While a reply streams, the young generations still
collect as usual (the garbage of a streamed update dies young); only the full collections wait
until the reply ends, when the next one runs as it would have.
"""

from __future__ import annotations

import gc

# A threshold no reply reaches: the oldest generation collects after this many collections of
# the middle one (about one per 7,000 allocations at CPython's default thresholds).
HELD_THRESHOLD = 1 << 30


class FullCollectionHold:
    """`hold()` defers full collections until `release()`; both are idempotent."""

    def __init__(self) -> None:
        self._saved: int | None = None

    @property
    def held(self) -> bool:
        return self._saved is not None

    def hold(self) -> None:
        if self._saved is None:
            young, middle, self._saved = gc.get_threshold()
            gc.set_threshold(young, middle, HELD_THRESHOLD)

    def release(self) -> None:
        if self._saved is not None:
            young, middle, _ = gc.get_threshold()
            gc.set_threshold(young, middle, self._saved)
            self._saved = None
