"""Process memory for the live panel: RSS from /proc, GPU memory only where CUDA is present.

Both are best-effort hints: any failure returns None and the panel shows a dash.
"""

from __future__ import annotations

import os


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def gpu_bytes() -> int | None:
    """Device memory in use, via CuPy's runtime if it is already imported (never imported here:
    importing CUDA just to show a number would cost seconds and memory)."""
    import sys

    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        free, total = cupy.cuda.runtime.memGetInfo()
        return int(total - free)
    except Exception:
        return None


def memory_probe() -> tuple[int | None, int | None]:
    return rss_bytes(), gpu_bytes()
