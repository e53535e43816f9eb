"""Pace streamed-text updates by what rendering them costs the UI thread.

Each update of the transcript (Markdown parse of the new tail, a layout of the whole screen, a
compositor pass) is Python on the UI thread. When llama.cpp's threads already use every core (the
default on a small machine), every millisecond the UI thread runs is taken from the decode, and
llama.cpp's threads wait for each other at every op, so the decode loses about twice the UI's
share of a core.
An update costs a layout of the whole screen (one: the widgets of a streaming message do not ask
for a second when their virtual size changes, `app/widgets/transcript/one_layout.py`) and a
redraw of what changed. The streaming message holds room below its text
(`MessageView._reserve`), so most updates grow it inside that room and the transcript neither
grows nor scrolls and only the new lines are drawn; the one in a few that renews the room
scrolls the transcript and redraws all of it, and costs more (docs/results/tui.md has the
figures).

The pacer reads the UI thread's own CPU clock and stretches the interval between updates so that
the UI stays within a budget: 1% of a core when it shares the cores with llama.cpp, half a core
when it has one of its own. A fast machine still streams 30 times a second; a small one streams
every one to two seconds (and two seconds after the first update, whose cost is not known yet):
less often, not slower. The ceiling, two seconds, is how long a user may wait for new text; an
update of 20 ms or less stays within the budget there.

The UI counts as having a core of its own only when the decode's threads leave it two
(`ui_has_own_core`). One core left over is not the UI's: anything else that runs (the terminal,
tmux, a build) takes it too, and while it is taken the UI's work comes out of the decode
thread's time, so a UI at half a core there slows a one-thread decode as it would on shared
cores (docs/results/tui.md, 2026-12-04).
"""

from __future__ import annotations

import time
from collections.abc import Callable


SPARE_CORES_FOR_THE_UI = 2
"""Cores the decode's threads must leave free for the UI to count as having one of its own."""


def ui_has_own_core(usable_cores: int, decode_threads: int) -> bool:
    """Whether the pacer gives the UI thread the budget of a core of its own (up to half a
    core): the decode's threads leave it `SPARE_CORES_FOR_THE_UI` cores (see the module's doc)."""
    return usable_cores - decode_threads >= SPARE_CORES_FOR_THE_UI


def thread_cpu_clock(thread_id: int | None) -> Callable[[], float] | None:
    """The CPU seconds a thread has used so far, as a function; None where there is no
    per-thread CPU clock."""
    try:
        clock = time.pthread_getcpuclockid(thread_id) if thread_id is not None else None
        if clock is None:
            return None
        time.clock_gettime(clock)
    except (OSError, AttributeError):
        return None
    return lambda: time.clock_gettime(clock)


class StreamPacer:
    MIN_INTERVAL = 1 / 30
    MAX_INTERVAL = 2.0
    SHARED_CORES_SHARE = 0.01
    OWN_CORE_SHARE = 0.5

    def __init__(
        self,
        ui_thread_id: int | None,
        *,
        ui_has_own_core: bool,
        cpu_clock: Callable[[], float] | None = None,
    ) -> None:
        """`cpu_clock`: the UI thread's CPU seconds (tests); by default read from the thread
        `ui_thread_id`. Without a clock the pace stays at `MIN_INTERVAL`."""
        self.share = self.OWN_CORE_SHARE if ui_has_own_core else self.SHARED_CORES_SHARE
        self._clock = cpu_clock or thread_cpu_clock(ui_thread_id)
        self._cpu = self._clock() if self._clock is not None else 0.0
        self.interval = self.MIN_INTERVAL
        self._last = float("-inf")

    def due(self, now: float) -> bool:
        return now - self._last >= self.interval

    def posted(self, now: float) -> None:
        """Call after posting an update: the UI's CPU since the previous one sets the pace.

        After the first update of a reply nothing has measured an update yet (the UI's CPU
        until then went to the turn's start: mounting the messages, the prefill's progress, and
        how much of it the first token follows depends on the prefill's length), so on shared
        cores the second waits the ceiling."""
        first = self._last == float("-inf")
        self._last = now
        if self._clock is None:
            return
        cpu = self._clock()
        used, self._cpu = cpu - self._cpu, cpu
        if first and self.share == self.SHARED_CORES_SHARE:
            self.interval = self.MAX_INTERVAL
            return
        self.interval = min(self.MAX_INTERVAL, max(self.MIN_INTERVAL, used / self.share))
