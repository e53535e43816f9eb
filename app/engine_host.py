"""The app's handle on the engine: which engine, its lock, and how to make a new one.

The engine is not thread-safe, so every call into it (load, turn, preview, close) happens with
`lock` held, from a worker thread. The generation worker holds it for a whole turn; the preview
worker only tries to take it and skips when a turn runs. Tests pass a fake `factory`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from velo_chat.engine.engine import Engine
from velo_chat.engine.config.profile_schema import Profile

log = logging.getLogger(__name__)


class EngineLike(Protocol):
    """What the app uses of `Engine` (the real one, or a fake in layout tests)."""

    model: Any
    ctx: Any

    def check(self) -> None:
        """Raise a user error now if the model cannot be loaded (a missing or bad file),
        cheaply and before the running engine is closed."""

    def load(self, on_event=None, cancel=None): ...
    def turn(self, messages, *, sampling=None, max_tokens=None, cancel=None, **kw): ...
    def preview(self, messages): ...
    def close(self) -> None: ...


EngineFactory = Callable[[Profile], EngineLike]


def real_engine(profile: Profile) -> EngineLike:
    return Engine(profile)


class EngineHost:
    def __init__(self, factory: EngineFactory = real_engine) -> None:
        self.factory = factory
        self.lock = threading.Lock()
        self.engine: EngineLike | None = None
        self.profile: Profile | None = None  # the profile the loaded engine was built from
        self.last_preview_failure = ""  # logged once per distinct failure

    @property
    def loaded(self) -> bool:
        """An engine exists and its model is loaded (turns and previews can run)."""
        return self.engine is not None and self.engine.model is not None

    def close_locked(self) -> None:
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:  # closing must never stop the app from quitting
                log.exception("closing the engine failed")
            self.engine = None
            self.profile = None

    def close(self, timeout: float = 30.0) -> None:
        """Close the engine once the running turn (already told to stop) lets go of it."""
        if not self.lock.acquire(timeout=timeout):
            log.warning("the engine is still busy after %.0f s; not closing it", timeout)
            return
        try:
            self.close_locked()
        finally:
            self.lock.release()
