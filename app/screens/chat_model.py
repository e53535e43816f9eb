"""The chat screen's model: (re)load in the background, progress, ready or failed, the fit
check's "Load anyway", the PLE table's page-cache residency, and the thinking key's choice.

`ChatScreen` owns one `ModelLoader` and hands it its model messages; what the loader uses is
given to it: the app, the screen's worker and timer functions, the widgets it writes to, and
callbacks into the screen. It keeps `chat.py` to one idea: the conversation.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from textual.message import Message
from textual.timer import Timer

from velo_chat.engine import ModelLoaded, ThinkingSupport
from velo_chat.engine.config import Profile, ReasoningSettings
from velo_chat.engine.setup import BUILTIN

from ..dialogs.confirm import ConfirmDialog
from ..dialogs.message import error_dialog
from ..generation import run_load
from ..load_rate import LoadRate, model_bytes
from ..messages import ModelLoadFailed, ModelLoadProgress, ModelReady
from ..ple_watch import PleWatch
from ..widgets.telemetry.panel import LivePanel

if TYPE_CHECKING:
    from .base import RunningApp, RunWorker

PLE_INTERVAL = 10.0  # seconds between looks at the PLE table's page-cache residency

SetInterval = Callable[[float, Callable[[], object]], Timer]


def model_name(profile: Profile) -> str:
    """The model's name in the live panel."""
    if profile.backend.kind == "remote":
        host = profile.backend.base_url.split("//", 1)[-1].split("/", 1)[0]
        return f"{profile.backend.model or 'model'} @ {host}"
    path = profile.model.path
    if path in BUILTIN:
        return "SmolLM2 (default)" if path == "default" else "SmolLM2 Q8_0 (default)"
    return path.rsplit("/", 1)[-1]


class ModelLoader:
    """The running model as the chat screen sees it: whether one is ready, what it reported,
    and the load in progress (its messages carry a `load_id`; an older load's are ignored)."""

    def __init__(
        self,
        app: RunningApp,
        *,
        post: Callable[[Message], object],
        run_worker: RunWorker,
        set_interval: SetInterval,
        panel: Callable[[], LivePanel],
        show_line: Callable[[str], None],
        stop_turn: Callable[[], None],
        ready_changed: Callable[[], None],
        request_preview: Callable[[], None],
    ) -> None:
        """`post` and `run_worker` are the screen's (the load runs in its "generation" worker
        group, so a load and a turn never run at once); `panel` and `show_line` are the live
        panel and the line under the composer; `stop_turn` stops a running turn before a load;
        `ready_changed` is called whenever `ready` changes; `request_preview` asks for the
        resume-cost line again."""
        self._app = app
        self._post = post
        self._run_worker = run_worker
        self._panel = panel
        self._show_line = show_line
        self._stop_turn = stop_turn
        self._ready_changed = ready_changed
        self._request_preview = request_preview
        self.ready = False  # a model is loaded: turns can run
        self.info: ModelLoaded | None = None  # what the running engine reported
        self.thinking: ThinkingSupport | None = None  # the running model's template
        self.load_id = 0  # messages of an older load are stale and ignored
        self._cancel = threading.Event()
        self._activate_on_ready = False  # make the loading profile the saved active one
        self._loading_name = ""
        self._rate = LoadRate(None)  # bytes/s and time left of the load in progress
        self.ple = PleFollower(
            run_worker=run_worker,
            call_from_thread=app.call_from_thread,
            set_interval=set_interval,
            panel=panel,
            model_path=lambda: Path(self.info.path) if self.info is not None else None,
        )

    def stop(self) -> None:
        """The app is closing: a load in progress must not finish."""
        self._cancel.set()

    def reload(self, profile: Profile, *, activate: bool = False, force: bool = False) -> None:
        """Load (or reload) the engine for `profile` in the background. The app adopts the
        profile only once it is loaded (`activate`: and saves it as the active one); a failed
        load leaves the previous profile running. `force`: load even if the fit check says
        the model does not fit (the user chose "Load anyway")."""
        self._set_ready(False)
        self._stop_turn()  # a running turn stops first; the load waits for the engine lock
        self._cancel.set()  # an older load still running must not finish (or announce)
        self._cancel = threading.Event()
        self.load_id += 1
        self._activate_on_ready = activate
        self._loading_name = model_name(profile)
        local = profile.backend.kind != "remote" and profile.model.path not in BUILTIN
        self._rate = LoadRate(model_bytes(Path(profile.model.path)) if local else None)
        self._panel().model_loading(0.0, self._loading_name)
        load = partial(run_load, self._app.host, profile, self._post, self._cancel, self.load_id, force)
        self._run_worker(load, name="_load", group="generation", exclusive=True, thread=True)

    def _set_ready(self, ready: bool) -> None:
        self.ready = ready
        self._ready_changed()

    def progress(self, msg: ModelLoadProgress) -> None:
        if msg.load_id == self.load_id:
            rate = self._rate.text(msg.progress)
            name = f"{self._loading_name} ({rate})" if rate else self._loading_name
            self._panel().model_loading(msg.progress, name)

    def loaded(self, msg: ModelReady) -> None:
        if msg.load_id != self.load_id:
            return  # an older load, superseded (its engine was already replaced)
        self.info = msg.info
        self.thinking = msg.thinking
        self._set_ready(True)
        self._app.adopt_profile(msg.profile, activate=self._activate_on_ready)
        self._panel().model_ready(msg.info, model_name(msg.profile))
        self.ple.watch(msg.info)
        self._request_preview()

    def failed(self, msg: ModelLoadFailed) -> None:
        if msg.load_id != self.load_id:
            return
        panel = self._panel()
        if msg.active is not None:
            self.info = msg.active_info or self.info
            self._set_ready(self.info is not None)
        else:
            self.info = None
            self._set_ready(False)
        if self.ready and self.info is not None and msg.active is not None:
            panel.model_ready(self.info, model_name(msg.active))
            self._app.adopt_profile(msg.active)
            body = f"{msg.reason}\n\nStill running profile {msg.active.name!r}."
            self._request_preview()
        else:
            panel.model_failed(msg.reason)
            self._show_line("[b $error]no model loaded[/]")
            body = msg.reason
        if msg.refused is not None:
            self._offer_load_anyway(msg)
            return
        self._app.push_screen(error_dialog("The model did not load", body))

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
                self.reload(refused, activate=activate, force=True)
            elif closed is not None:
                self.reload(closed)

        self._app.push_screen(
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


class ThinkingChoice:
    """The thinking key's choice for the next turns (not saved in the profile): on or off, with
    the profile's `reasoning.enabled` when the key was pressed; a profile saved with another
    value since then wins."""

    def __init__(self, *, profile: Callable[[], Profile], support: Callable[[], ThinkingSupport | None]):
        """`profile` is the running profile, `support` what the running model's template can do
        (None: no model)."""
        self._profile = profile
        self._support = support
        self._choice: tuple[str, bool] | None = None

    def reasoning(self) -> ReasoningSettings:
        """The reasoning settings the next turn runs with: the profile's, with the key's choice
        while the profile's `reasoning.enabled` is still what it was then."""
        settings = self._profile().reasoning
        if self._choice is not None and self._choice[0] == settings.enabled:
            return dataclasses.replace(settings, enabled="on" if self._choice[1] else "off")
        return settings

    def thinks(self) -> bool | None:
        """Whether the next turn thinks (None: the model's template has no thinking switch)."""
        support = self._support()
        if support is None or not support.can_switch:
            return None
        return support.thinks(self.reasoning())

    def toggle(self) -> bool | None:
        """Flip thinking for the next turns; whether they think now (None: no switch)."""
        thinks = self.thinks()
        if thinks is None:
            return None
        self._choice = (self._profile().reasoning.enabled, not thinks)
        return not thinks


class PleFollower:
    """Follows the loaded model's PLE table in the page cache (the live panel shows it): looked
    at once when a model is ready, then every `PLE_INTERVAL` seconds if the model has one."""

    def __init__(
        self,
        *,
        run_worker: RunWorker,
        call_from_thread: Callable[..., object],
        set_interval: SetInterval,
        panel: Callable[[], LivePanel],
        model_path: Callable[[], Path | None],
    ) -> None:
        """`model_path` is the running model's file (None: none runs): a look that finishes
        after another model was loaded is dropped."""
        self._run_worker = run_worker
        self._call_from_thread = call_from_thread
        self._set_interval = set_interval
        self._panel = panel
        self._model_path = model_path
        self._timer: Timer | None = None  # polls the PLE table's page-cache residency

    def watch(self, info: ModelLoaded) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._panel().ple_residency(None)
        self._probe(PleWatch(Path(info.path)))

    def _probe(self, watch: PleWatch) -> None:
        look = partial(self._look, watch)
        self._run_worker(look, name="_probe_ple", group="ple", exclusive=True, thread=True)

    def _look(self, watch: PleWatch) -> None:
        fraction = watch.fraction()  # headers and mincore: off the UI thread
        if fraction is not None:
            self._call_from_thread(self._show, watch, fraction)

    def _show(self, watch: PleWatch, fraction: float) -> None:
        if self._model_path() != watch.model_path:
            return  # another model since
        self._panel().ple_residency(fraction)
        if self._timer is None:
            self._timer = self._set_interval(PLE_INTERVAL, lambda: self._probe(watch))
