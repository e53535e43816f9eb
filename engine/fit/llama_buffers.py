"""What llama.cpp really allocated, read from its buffer-size log lines (`llama_log` routes them
into Python logging): the yardstick for the fit estimate (tests/test_fit.py, docs/fit.md).

    load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
    llama_kv_cache:        CPU KV buffer size =    45.00 MiB
    llama_memory_recurrent:        CPU RS buffer size =     0.01 MiB
    llama_context:        CPU  output buffer size =     0.19 MiB
    sched_reserve:        CPU compute buffer size =    12.81 MiB

Sizes are logged in MiB with two decimals, so a buffer under 0.5 MiB is known to +-0.005 MiB only.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from .. import llama_log

MIB = 1 << 20
LINE = re.compile(
    r"^\S+:\s+(?P<buffer>\S+)\s+(?P<kind>model|KV|RS|output|compute) buffer size =\s+(?P<mib>[\d.]+) MiB"
)
ROUNDING = 0.005 * MIB  # the log's precision


@dataclass
class Buffers:
    """Bytes per kind ("model", "KV", "RS", "output", "compute"), each buffer as logged."""

    lines: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, buffer type, bytes)

    def feed(self, message: str) -> None:
        m = LINE.match(message.strip())
        if m:
            self.lines.append((m["kind"], m["buffer"], round(float(m["mib"]) * MIB)))

    def total(self, kind: str) -> int:
        return sum(n for k, _b, n in self.lines if k == kind)

    def sizes(self, kind: str) -> list[int]:
        return [n for k, _b, n in self.lines if k == kind]


class _Handler(logging.Handler):
    def __init__(self, buffers: Buffers) -> None:
        super().__init__(logging.DEBUG)
        self.buffers = buffers

    def emit(self, record: logging.LogRecord) -> None:
        self.buffers.feed(record.getMessage())


@contextlib.contextmanager
def captured() -> Iterator[Buffers]:
    """Collect the buffer sizes llama.cpp logs while the block runs (a load, a context)."""
    buffers = Buffers()
    handler = _Handler(buffers)
    logger = llama_log.logger
    old_level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield buffers
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
