"""The base of velo-chat's full screens: `self.app` typed as the app they run in.

Textual types a widget's `app` as `App[object]`; the screens read velo-chat's own state from it
(the active profile, the store, the engine host), so the type checker is told what that app
holds: `VeloApp`, a protocol declared here, which `VeloChatApp` (app/app.py) satisfies. The
screens never import app.py (app.py imports them: `tests/test_screen_imports.py`). Only the type
checker sees the typed `app` (`textual.getters.app` is newer than the oldest Textual we support).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from textual.app import App
from textual.screen import Screen
from textual.signal import Signal

from velo_chat.engine.config import Profile
from velo_chat.store import SessionStore

from ..engine_host import EngineHost
from ..settings import AppSettings
from ..widgets.telemetry.panel import MemoryProbe


class VeloApp(Protocol):
    """What velo-chat's screens read from their app, besides Textual's own `App`."""

    profile: Profile  # the running profile; replaced (never changed) and broadcast on a change
    profile_changed: Signal[Profile]
    store: SessionStore
    host: EngineHost
    settings: AppSettings
    clock: Callable[[], float]  # the live panel's clock
    wall_clock: Callable[[], float]  # the sidebar's (session times)
    memory_probe: MemoryProbe
    memory_interval: float | None
    cursor_blink: bool
    load_on_start: bool
    pace_stream: bool

    def use_profile(self, profile: Profile, *, ask: bool = True, activate: bool = False) -> None: ...

    def adopt_profile(self, profile: Profile, *, activate: bool = False) -> bool: ...


class RunWorker(Protocol):
    """A screen's `run_worker`, as the parts the screen is composed of call it: their workers
    belong to the screen (a worker group is exclusive per screen, and ends with it)."""

    def __call__(
        self, work: Callable[[], None], *, name: str, group: str, exclusive: bool, thread: bool
    ) -> object: ...


if TYPE_CHECKING:
    from textual import getters

    class RunningApp(App[None], VeloApp):
        """A Textual app with velo-chat's state: `self.app` on a screen (for the type checker
        only)."""


class VeloScreen(Screen[None]):
    if TYPE_CHECKING:
        app = getters.app(RunningApp)
