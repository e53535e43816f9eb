"""How fast a model is loading and how long is left, for the CLI's progress line and the TUI's
live panel: llama.cpp reports the fraction of tensor data loaded, so the bytes so far are that
fraction of the model's size (all its shards)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

_SHARD = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
MIN_ELAPSED = 0.5  # seconds before the rate means anything


def model_bytes(path: Path) -> int | None:
    """The size of a model on disk, every shard of a split model counted (named as llama.cpp
    names them); None when a file is missing. Reads no header: cheap enough for the UI thread."""
    path = Path(path).expanduser()
    m = _SHARD.match(path.name)
    paths = [path]
    if m:
        count = int(m["count"])
        paths = [path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    try:
        return sum(p.stat().st_size for p in paths)
    except OSError:
        return None


class LoadRate:
    """`2.10 GB/s · 40 s left` from the load's progress fraction."""

    def __init__(self, total_bytes: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total_bytes
        self.clock = clock
        self.t0 = clock()

    def text(self, fraction: float) -> str:
        elapsed = self.clock() - self.t0
        if fraction <= 0 or fraction >= 1 or elapsed < MIN_ELAPSED:
            return ""
        left = elapsed * (1 - fraction) / fraction
        parts = [f"{fraction * self.total / elapsed / 1e9:.2f} GB/s"] if self.total else []
        parts.append(f"{left:.0f} s left" if left < 120 else f"{left / 60:.0f} min left")
        return " · ".join(parts)
