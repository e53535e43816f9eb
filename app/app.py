"""The Textual App subclass and the `make_app` factory the CLI and the tests use.

The app owns the long-lived things (the session store, the engine host, the active profile,
app settings) and hands screens what they need; it holds no conversation state itself. Every
source of variation between runs is injectable (engine factory, clocks, memory probe, cursor
blink, loading the model at start) so snapshot tests are deterministic.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from textual.app import App, SystemCommand
from textual.screen import Screen
from textual.signal import Signal

from velo_chat.engine import ProfileError
from velo_chat.engine.config import SECTIONS, Profile, database_path, set_active_profile
from velo_chat.store import SessionStore

from . import keymap
from .dialogs.confirm import ConfirmDialog
from .dialogs.message import error_dialog
from .engine_host import EngineFactory, EngineHost, real_engine
from .errors import USER_ERRORS
from .screens.chat import ChatScreen
from .screens.help import HelpScreen
from .screens.settings import SettingsScreen
from .settings import AppSettings, load_app_settings
from .sysinfo import memory_probe as default_memory_probe
from .widgets.telemetry.panel import MemoryProbe


def reload_needed(old: Profile, new: Profile) -> str | None:
    """ "model" or "context" when going from `old` to `new` needs the engine rebuilt, else None
    (sampling and display changes apply to the next turn, and so do the context's settings that
    declare no `reload`: what happens when it is full)."""
    if old.model != new.model:
        return "model"
    for name in SECTIONS:
        a, b = getattr(old, name), getattr(new, name)
        for f in dataclasses.fields(a):
            if f.metadata.get("reload") and getattr(a, f.name) != getattr(b, f.name):
                return f.metadata["reload"]
    return None


class VeloChatApp(App[None]):
    TITLE = "velo-chat"
    CSS_PATH = ["../assets/styles/app.tcss", "../assets/styles/tools.tcss"]  # tools: dialogs, transcript
    BINDINGS = keymap.bindings("app")

    def __init__(
        self,
        profile: Profile,
        *,
        store: SessionStore,
        host: EngineHost,
        settings: AppSettings,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        memory_probe: MemoryProbe,
        memory_interval: float | None,
        cursor_blink: bool,
        load_on_start: bool,
        owns_store: bool,
        pace_stream: bool = True,
    ) -> None:
        super().__init__()
        self.profile = profile
        self.store = store
        self.host = host
        self.settings = settings
        self.clock = clock
        self.wall_clock = wall_clock
        self.memory_probe = memory_probe
        self.memory_interval = memory_interval
        self.cursor_blink = cursor_blink
        self.load_on_start = load_on_start
        self.pace_stream = pace_stream
        self._owns_store = owns_store
        self.profile_changed: Signal[Profile] = Signal(self, "profile-changed")

    def on_mount(self) -> None:
        # The chat screen first: keys typed while the app starts go to its composer.
        self.push_screen(ChatScreen())
        if self.settings.keymap:
            self.set_keymap(self.settings.keymap)
        for problem in self.settings.problems:
            self.notify(problem, severity="warning", timeout=8)
        self._apply_theme(self.profile)

    def _apply_theme(self, profile: Profile) -> None:
        if profile.display.theme in self.available_themes:
            self.theme = profile.display.theme

    def on_unmount(self) -> None:
        self.host.close()  # the chat screen told a running turn to stop when it unmounted
        if self._owns_store:
            self.store.close()

    # -- profiles -----------------------------------------------------------------------------

    def use_profile(self, profile: Profile, *, ask: bool = True, activate: bool = False) -> None:
        """Run `profile`. Sampling/display changes apply to the next turn; a change that needs
        the model or context rebuilt asks first, then reloads in the background, and the
        profile is adopted only once its model is loaded (a failed load keeps the previous one
        running). `activate` also saves it as the active profile, at the same moment."""
        need = reload_needed(self.host.loaded_profile or self.profile, profile)
        chat = next((s for s in self.screen_stack if isinstance(s, ChatScreen)), None)
        if need is None or chat is None:
            self.adopt_profile(profile, activate=activate)
            return

        def reload() -> None:
            chat.reload_model(profile, activate=activate)

        def answer(yes: bool | None) -> None:
            if yes:
                reload()
                return
            try:  # adopted without a reload: at least its model file must be there
                self.host.factory(profile).check()
            except USER_ERRORS as exc:
                self.push_screen(error_dialog(f"Cannot use profile {profile.name!r}", str(exc)))
                return
            if self.adopt_profile(profile, activate=activate):
                self.notify(f"Keeping the loaded model; the {need} change applies after a reload.", timeout=6)

        if not ask:
            reload()
            return
        what = "load the model again" if need == "model" else "rebuild the context"
        self.push_screen(
            ConfirmDialog(
                "Reload needed",
                f"Profile {profile.name!r} needs to {what}. The live context is lost. Reload now?",
                yes="Reload",
                no="Later",
            ),
            answer,
        )

    def adopt_profile(self, profile: Profile, *, activate: bool = False) -> bool:
        """Make `profile` the running one and tell every screen; with `activate`, save it as
        the active profile first (nothing changes if that fails). Returns False on failure."""
        if activate:
            try:
                set_active_profile(profile.name)
            except (ProfileError, OSError) as exc:
                self.push_screen(error_dialog("Could not save the active profile", str(exc)))
                return False
        if profile != self.profile:
            self.profile = profile
            self._apply_theme(profile)
        self.profile_changed.publish(profile)
        return True

    # -- actions and the palette --------------------------------------------------------------

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_settings(self) -> None:
        if not isinstance(self.screen, SettingsScreen):
            self.push_screen(SettingsScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's own commands (theme, keys, quit) plus every action in the keymap
        catalogue that makes sense on this screen."""
        yield from super().get_system_commands(screen)
        scopes = {"settings"} if screen.id == "settings" else {"chat", "sessions", "message"}
        for a in keymap.ACTIONS:
            if a.scope == "app" and a.id != "app.quit":
                yield SystemCommand(
                    a.description, f"key: {self._key(a)}", lambda a=a: self.run_action(a.action)
                )
            elif a.scope in scopes and (a.palette_action or a.scope != "message"):
                action = a.palette_action or a.action
                yield SystemCommand(
                    a.description, f"key: {self._key(a)}", lambda action=action: screen.run_action(action)
                )

    def _key(self, action: keymap.KeyAction) -> str:
        return keymap.effective_key(action, self.settings.keymap)


def make_app(
    profile: Profile,
    *,
    engine_factory: EngineFactory = real_engine,
    store: SessionStore | None = None,
    settings: AppSettings | None = None,
    clock: Callable[[], float] = time.perf_counter,
    wall_clock: Callable[[], float] = time.time,
    memory_probe: MemoryProbe = default_memory_probe,
    memory_interval: float | None = 2.0,
    cursor_blink: bool = True,
    load_on_start: bool = True,
    pace_stream: bool = True,
) -> VeloChatApp:
    """Build the app. Tests pass a fake `engine_factory`, a store on a temp path, fixed clocks,
    `cursor_blink=False`, `memory_interval=None` and `pace_stream=False` (the stream's pace
    would follow the machine's CPU)."""
    owns = store is None
    return VeloChatApp(
        profile,
        store=store or SessionStore(database_path()),
        host=EngineHost(engine_factory),
        settings=settings or load_app_settings(),
        clock=clock,
        wall_clock=wall_clock,
        memory_probe=memory_probe,
        memory_interval=memory_interval,
        cursor_blink=cursor_blink,
        load_on_start=load_on_start,
        owns_store=owns,
        pace_stream=pace_stream,
    )


if TYPE_CHECKING:
    from .screens.base import VeloApp

    _screens_view: type[VeloApp] = VeloChatApp  # the screens see the app through `VeloApp`
