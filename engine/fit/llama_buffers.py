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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..llama import log as llama_log
from .estimate import Term

MIB = 1 << 20
LINE = re.compile(
    r"^\S+:\s+(?P<buffer>\S+)\s+(?P<kind>model|KV|RS|output|compute) buffer size =\s+(?P<mib>[\d.]+) MiB"
)
ROUNDING = 0.005 * MIB  # the log's precision


@dataclass
class Buffers:
    """Bytes per kind ("model", "KV", "RS", "output", "compute"), each buffer as logged."""

    lines: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, buffer type, bytes)
    log: list[str] = field(default_factory=list)  # every line llama.cpp logged meanwhile

    def feed(self, message: str) -> None:
        self.log.append(message)
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
def captured(level: int = logging.INFO) -> Iterator[Buffers]:
    """Collect the buffer sizes llama.cpp logs while the block runs (a load, a context), and
    every line it logs at `level` or above (DEBUG: GGML_SCHED_DEBUG's split assignment too)."""
    buffers = Buffers()
    handler = _Handler(buffers)
    handler.setLevel(level)
    logger = llama_log.logger
    old_level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    try:
        yield buffers
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def on_gpu(buffer: str) -> bool:
    """A device buffer ("CUDA0"), not host memory ("CPU", "CPU_Mapped", "CUDA_Host")."""
    return not (buffer.startswith("CPU") or buffer.endswith("_Host"))


@dataclass(frozen=True)
class Comparison:
    """One term of the estimate against what llama.cpp allocated for it."""

    what: str  # weights, KV, recurrent, output, compute
    device: str  # CPU or GPU
    estimate: int
    measured: int

    @property
    def close(self) -> bool:
        """Within 10%, or within the log line's own rounding."""
        return abs(self.estimate - self.measured) <= max(0.10 * self.measured, ROUNDING)

    def describe(self) -> str:
        off = (self.estimate / self.measured - 1) if self.measured else float("inf")
        return (
            f"{self.what} ({self.device}): estimated {self.estimate / MIB:.2f} MiB, "
            f"llama.cpp {self.measured / MIB:.2f} MiB ({off:+.1%})"
        )


# (what, device) -> (llama.cpp buffer kind, the estimate's term keys)
_GROUPS = {
    ("weights", "CPU"): ("model", ("weights_cpu", "ple")),
    ("weights", "GPU"): ("model", ("weights_gpu",)),
    ("KV", "CPU"): ("KV", ("kv_cpu",)),
    ("KV", "GPU"): ("KV", ("kv_gpu",)),
    ("recurrent", "CPU"): ("RS", ("rs_cpu",)),
    ("recurrent", "GPU"): ("RS", ("rs_gpu",)),
    ("output", "CPU"): ("output", ("output",)),
    ("compute", "CPU"): ("compute", ("compute_cpu",)),
    ("compute", "GPU"): ("compute", ("compute_gpu",)),
}


def compare(terms: Sequence[Term], buffers: Buffers) -> list[Comparison]:
    """Each term of the estimate next to the buffers llama.cpp logged for it (host buffers,
    pinned ones included, count as CPU; the output buffer is always host memory). A term whose
    log line shows another figure than the memory it needs (`Term.logged`: the mapped range of
    the CPU weights) is compared by that figure."""
    by_key = {t.key: t.bytes if t.logged is None else t.logged for t in terms}
    out = []
    for (what, device), (kind, keys) in _GROUPS.items():
        est = sum(by_key.get(k, 0) for k in keys)
        measured = sum(
            n
            for k, buf, n in buffers.lines
            if k == kind and (kind == "output" or on_gpu(buf) == (device == "GPU"))
        )
        if est or measured:
            out.append(Comparison(what, device, est, measured))
    return out
