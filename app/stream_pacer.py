"""Pace streamed-text updates by what rendering them costs the UI thread.

Each update of the transcript (Markdown parse of the new tail, layout, a compositor pass) is
Python on the UI thread. When llama.cpp's threads already use every core — the default on a
small machine — every millisecond the UI thread runs is taken from the decode, and llama.cpp's
threads wait for each other at every op, so a busy UI slows decoding far more than its own
share (measured: 30 updates/s cost 25% of decode speed on 2 cores). The pacer reads the UI
thread's own CPU clock and stretches the interval between updates so that the UI stays within a
budget: 3% of a core when it shares the cores with llama.cpp, half a core when it has one of its
own. A fast machine still streams 30 times a second; a small one streams less often, not slower.
"""

from __future__ import annotations

import time


class StreamPacer:
    MIN_INTERVAL = 1 / 30
    MAX_INTERVAL = 1.0

    def __init__(self, ui_thread_id: int | None, *, ui_has_own_core: bool) -> None:
        self.share = 0.5 if ui_has_own_core else 0.03
        try:
            self._clock: int | None = (
                time.pthread_getcpuclockid(ui_thread_id) if ui_thread_id is not None else None
            )
            self._cpu = time.clock_gettime(self._clock) if self._clock is not None else 0.0
        except (OSError, AttributeError):  # no per-thread CPU clock: fixed rate
            self._clock = None
            self._cpu = 0.0
        self.interval = self.MIN_INTERVAL
        self._last = float("-inf")

    def due(self, now: float) -> bool:
        return now - self._last >= self.interval

    def posted(self, now: float) -> None:
        """Call after posting an update: the UI's CPU since the previous one sets the pace."""
        self._last = now
        if self._clock is None:
            return
        cpu = time.clock_gettime(self._clock)
        used, self._cpu = cpu - self._cpu, cpu
        self.interval = min(self.MAX_INTERVAL, max(self.MIN_INTERVAL, used / self.share))
