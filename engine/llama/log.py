"""Route llama.cpp's log lines into Python `logging` (never to the terminal).

llama-cpp-python installs a callback at import that prints to stderr, and its `Llama(verbose=False)`
silences llama.cpp by dup2-ing the process's stdout/stderr to /dev/null — both fatal under a TUI.
We replace the callback with one that buffers the C fragments into lines and logs them to the
`velo_chat.llama` logger; the CLI and the app attach a file handler in the log dir.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

from ..config import locations

logger = logging.getLogger("velo_chat.llama")

# ggml_log_level (ggml.h: NONE, DEBUG, INFO, WARN, ERROR, CONT) -> logging level;
# 5 (CONT) continues the previous line's level.
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}

_installed: list[object] = []  # keeps the ctypes callback alive for the process's lifetime
_lock = threading.Lock()


class _LineBuffer:
    """Joins the fragments llama.cpp logs (it often sends one line in several calls)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.level = logging.INFO
        self.lock = threading.Lock()
        self.last_error = ""

    def feed(self, level: int, text: str) -> None:
        with self.lock:
            if level != 5:
                self.level = _LEVELS.get(level, logging.INFO)
            self.parts.append(text)
            if not text.endswith("\n"):
                return
            line = "".join(self.parts).rstrip("\n")
            self.parts.clear()
            lvl = self.level
        if lvl >= logging.ERROR:
            self.last_error = line.strip()
        for listener in list(_listeners):
            try:
                listener(line)
            except Exception:  # a listener's bug must not drop the line or reach C
                logger.exception("a llama.cpp log listener failed")
        logger.log(lvl, "%s", line)


_buffer = _LineBuffer()
_listeners: list[Callable[[str], None]] = []  # `watch()` blocks open now, each called per line


@contextlib.contextmanager
def watch(listener: Callable[[str], None]) -> Iterator[None]:
    """Call `listener` with every line llama.cpp logs inside the block, whatever the logging
    level, on the thread that logs it (it must be quick; what it raises is logged, not passed
    on, and the line still reaches the log)."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


@contextlib.contextmanager
def lines() -> Iterator[list[str]]:
    """Collect every line llama.cpp logs inside the block, whatever the logging level (the
    engine reads facts from them that the C API does not give, such as a graph's splits)."""
    seen: list[str] = []
    with watch(seen.append):
        yield seen


def install() -> None:
    """Install the logging callback once per process (idempotent, thread-safe).

    It must come before anything initialises ggml's backends: the first call that asks about
    devices (`llama_supports_gpu_offload`, `llama_print_system_info`, a model load) registers
    them, and CUDA's registration logs its banner ("ggml_cuda_init: found 1 CUDA devices" and
    a line per device) through whatever callback is set then: llama-cpp-python's prints to
    stderr. `llama_log_set` sets ggml's callback too (`ggml_log_set`), which is the one those
    lines go through. So code that may be a command's first to touch llama.cpp takes the
    bindings from `bindings()`."""
    with _lock:
        if _installed:
            return
        import llama_cpp  # noqa: F401  (its import installs the printing callback we replace)
        from llama_cpp import llama_cpp as ll

        @ll.llama_log_callback
        def _callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            try:
                _buffer.feed(int(level), text.decode("utf-8", errors="replace"))
            except Exception:  # never raise into C
                pass

        ll.llama_log_set(_callback, ctypes.c_void_p(0))
        ll.llama_backend_init()
        _installed.append(_callback)


def bindings() -> ModuleType:
    """llama-cpp-python's `llama_cpp.llama_cpp`, once our callback is installed."""
    install()
    from llama_cpp import llama_cpp as ll

    return ll


def last_error() -> str:
    """The last ERROR line llama.cpp logged (for a one-line explanation of a failed load)."""
    return _buffer.last_error


def setup_file_logging(path: str, level: int = logging.INFO) -> logging.Handler:
    """Attach a file handler for velo-chat's loggers (the CLI and the app call this).

    The log names the user's files and models and records what failed and when, so it is private
    like the rest of velo-chat's data: created 0600 before `FileHandler` opens it (which would
    create it through the umask), and tightened if an older run left it 0644."""
    os.close(locations.create_private(Path(path), os.O_WRONLY | os.O_APPEND))
    locations.tighten(Path(path), locations.PRIVATE_FILE_MODE)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("velo_chat")
    root.addHandler(handler)
    root.setLevel(level)
    return handler


GRAPH_SPLITS = re.compile(r"graph.*splits = (\d+)(?: / (\d+))?")


def decode_graph_splits(lines: Sequence[str]) -> int:
    """The graph splits of a decode step, from llama.cpp's line at context creation
    ("graph_reserve: ... splits = <prefill> / <decode step>"); 0 when it logged none. Each split
    is a hand-over between backends (a GPU waiting on a CPU op, and back)."""
    found = [m for m in map(GRAPH_SPLITS.search, lines) if m]
    if not found:
        return 0
    return int(found[-1].group(2) or found[-1].group(1))
