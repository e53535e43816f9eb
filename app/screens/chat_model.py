"""The chat screen's model loading: (re)load in the background, progress, ready or failed, the
fit check's "Load anyway", and the PLE table's page-cache residency (a mixin, to keep `chat.py`
one idea: the conversation).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from textual import work
from textual.timer import Timer
from textual.widgets import Static

from velo_chat.engine.config.profile_schema import Profile
from velo_chat.engine.events import ModelLoaded
from velo_chat.engine.setup import default_model
from velo_chat.engine.prompt.thinking import ThinkingSupport

from ..dialogs.confirm import ConfirmDialog
from ..dialogs.message import error_dialog
from ..generation import run_load
from ..load_rate import LoadRate, model_bytes
from ..messages import ModelLoadFailed, ModelLoadProgress, ModelReady
from ..ple_watch import PleWatch
from ..widgets.telemetry.panel import LivePanel

if TYPE_CHECKING:
    from .base import VeloScreen as _Screen
else:
    _Screen = object

PLE_INTERVAL = 10.0  # seconds between looks at the PLE table's page-cache residency


class ModelLoading(_Screen):
    """Mixed into `ChatScreen`, which owns the state named below. Handlers use `on_<message>`
    names: Textual collects `@on` decorators only from the screen class itself. (A plain
    class at run time; a screen for the type checker.)"""

    if TYPE_CHECKING:  # what ChatScreen provides
        model_ready: bool
        _cancel: threading.Event
        _load_cancel: threading.Event
        _load_id: int
        _activate_on_ready: bool
        _model_info: ModelLoaded | None
        _loading_name: str
        _load_rate: LoadRate
        _ple_timer: Timer | None
        _thinking_support: ThinkingSupport | None

        def _sync_composer(self) -> None: ...
        def request_preview(self) -> None: ...

    # -- the model ----------------------------------------------------------------------------

    def reload_model(self, profile: Profile, *, activate: bool = False, force: bool = False) -> None:
        """Load (or reload) the engine for `profile` in the background. The app adopts the
        profile only once it is loaded (`activate`: and saves it as the active one); a failed
        load leaves the previous profile running. `force`: load even if the fit check says
        the model does not fit (the user chose "Load anyway")."""
        self.model_ready = False
        self._sync_composer()
        self._cancel.set()  # a running turn stops first; the load waits for the engine lock
        self._load_cancel.set()  # an older load still running must not finish (or announce)
        self._load_cancel = threading.Event()
        self._load_id += 1
        self._activate_on_ready = activate
        self._loading_name = self._model_name(profile)
        local = profile.backend.kind != "remote" and profile.model.path not in default_model.BUILTIN
        self._load_rate = LoadRate(model_bytes(Path(profile.model.path)) if local else None)
        self.query_one(LivePanel).model_loading(0.0, self._loading_name)
        self._load(profile, self._load_id, self._load_cancel, force)

    @work(thread=True, exclusive=True, group="generation")
    def _load(self, profile: Profile, load_id: int, cancel: threading.Event, force: bool = False) -> None:
        run_load(self.app.host, profile, self.post_message, cancel, load_id, force)

    def _model_name(self, profile: Profile) -> str:
        if profile.backend.kind == "remote":
            host = profile.backend.base_url.split("//", 1)[-1].split("/", 1)[0]
            return f"{profile.backend.model or 'model'} @ {host}"
        path = profile.model.path
        if path in default_model.BUILTIN:
            return "SmolLM2 (default)" if path == "default" else "SmolLM2 Q8_0 (default)"
        return path.rsplit("/", 1)[-1]

    def on_model_load_progress(self, msg: ModelLoadProgress) -> None:
        if msg.load_id == self._load_id:
            rate = self._load_rate.text(msg.progress)
            name = f"{self._loading_name} ({rate})" if rate else self._loading_name
            self.query_one(LivePanel).model_loading(msg.progress, name)

    def on_model_ready(self, msg: ModelReady) -> None:
        if msg.load_id != self._load_id:
            return  # an older load, superseded (its engine was already replaced)
        self._model_info = msg.info
        self._thinking_support = msg.thinking
        self.model_ready = True
        self._sync_composer()
        self.app.adopt_profile(msg.profile, activate=self._activate_on_ready)
        self.query_one(LivePanel).model_ready(msg.info, self._model_name(msg.profile))
        self._watch_ple(msg.info)
        self.request_preview()

    def on_model_load_failed(self, msg: ModelLoadFailed) -> None:
        if msg.load_id != self._load_id:
            return
        panel = self.query_one(LivePanel)
        if msg.active is not None:
            self._model_info = msg.active_info or self._model_info
            self.model_ready = self._model_info is not None
        else:
            self._model_info = None
            self.model_ready = False
        self._sync_composer()
        if self.model_ready and self._model_info is not None and msg.active is not None:
            panel.model_ready(self._model_info, self._model_name(msg.active))
            self.app.adopt_profile(msg.active)
            body = f"{msg.reason}\n\nStill running profile {msg.active.name!r}."
            self.request_preview()
        else:
            panel.model_failed(msg.reason)
            self.query_one("#preview-line", Static).update("[b $error]no model loaded[/]")
            body = msg.reason
        if msg.refused is not None:
            self._offer_load_anyway(msg)
            return
        self.app.push_screen(error_dialog("The model did not load", body))

    def _offer_load_anyway(self, msg: ModelLoadFailed) -> None:
        """The fit check refused the profile: show its table and let the user load anyway."""
        refused, closed, activate = msg.refused, msg.closed, self._activate_on_ready
        assert refused is not None
        still = (
            f"\n\nProfile {closed.name!r} was closed to make room; Cancel loads it again."
            if closed is not None
            else ""
        )

        def answer(load: bool | None) -> None:
            if load:
                self.reload_model(refused, activate=activate, force=True)
            elif closed is not None:
                self.reload_model(closed)

        self.app.push_screen(
            ConfirmDialog(
                "The model may not fit in memory",
                escape(
                    f"{msg.fit_table}{still}\n\nLoading it anyway can make the machine swap or stall. "
                    "`velo-chat doctor` shows the arithmetic."
                ),
                yes="Load anyway",
                no="Cancel",
            ),
            answer,
        )

    # -- the PLE table's page-cache residency -------------------------------------------------

    def _watch_ple(self, info: ModelLoaded) -> None:
        """Follow the loaded model's PLE table in the page cache (the live panel shows it):
        looked at once now, then every `PLE_INTERVAL` seconds if the model has one."""
        if self._ple_timer is not None:
            self._ple_timer.stop()
            self._ple_timer = None
        self.query_one(LivePanel).ple_residency(None)
        self._probe_ple(PleWatch(Path(info.path)))

    @work(thread=True, exclusive=True, group="ple")
    def _probe_ple(self, watch: PleWatch) -> None:
        fraction = watch.fraction()  # headers and mincore: off the UI thread
        if fraction is not None:
            self.app.call_from_thread(self._show_ple, watch, fraction)

    def _show_ple(self, watch: PleWatch, fraction: float) -> None:
        if self._model_info is None or Path(self._model_info.path) != watch.model_path:
            return  # another model since
        self.query_one(LivePanel).ple_residency(fraction)
        if self._ple_timer is None:
            self._ple_timer = self.set_interval(PLE_INTERVAL, lambda: self._probe_ple(watch))
