"""The app's handle on the engine: which engine, its lock, and how to make a new one.

The engine is not thread-safe, so every call into it (load, turn, preview, close) happens with
`lock` held, from a worker thread. The generation worker holds it for a whole turn; the preview
worker only tries to take it and skips when a turn runs. Tests pass a fake `factory`.

The app uses only the engine's public surface (`EngineAPI`, engine/api.py): what the loaded
model is comes from `engine.info`, the profile it was built from from `engine.profile`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from velo_chat.engine import EngineAPI, make_engine, render_block
from velo_chat.engine.config import Profile
from velo_chat.store import Attachment

log = logging.getLogger(__name__)

EngineFactory = Callable[[Profile], EngineAPI]


def real_engine(profile: Profile) -> EngineAPI:
    return make_engine(profile)


class EngineHost:
    def __init__(self, factory: EngineFactory = real_engine) -> None:
        self.factory = factory
        self.lock = threading.Lock()
        self.engine: EngineAPI | None = None
        self.last_preview_failure = ""  # logged once per distinct failure
        # attached files' tokens, counted once per file version and engine (previews run on
        # every pause in typing; a file's tokens do not change while it stays attached)
        self._file_tokens: dict[tuple[int, str, str], int | None] = {}

    def file_tokens(self, engine: EngineAPI, file: Attachment) -> int | None:
        """The tokens of `file`'s block as the model sees it (`render_block`), counted once per
        file version and engine. Call with `lock` held."""
        key = (id(engine), file.path, file.sha256)
        if key not in self._file_tokens:
            if len(self._file_tokens) > 256:  # a long session attaches many: forget the old ones
                self._file_tokens.clear()
            self._file_tokens[key] = engine.count_tokens(render_block(file))
        return self._file_tokens[key]

    @property
    def loaded(self) -> bool:
        """An engine exists and its model is loaded (turns and previews can run)."""
        return self.engine is not None and self.engine.loaded

    @property
    def loaded_profile(self) -> Profile | None:
        """The profile the loaded engine was built from (None: nothing loaded)."""
        return self.engine.profile if self.engine is not None and self.engine.loaded else None

    def close_locked(self) -> None:
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:  # closing must never stop the app from quitting
                log.exception("closing the engine failed")
            self.engine = None
            self._file_tokens.clear()

    def close(self, timeout: float = 30.0) -> None:
        """Close the engine once the running turn (already told to stop) lets go of it."""
        if not self.lock.acquire(timeout=timeout):
            log.warning("the engine is still busy after %.0f s; not closing it", timeout)
            return
        try:
            self.close_locked()
        finally:
            self.lock.release()
