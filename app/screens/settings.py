"""The settings screen: the profile list (shipped and user, the active one marked; Enter
activates) and the form of the highlighted profile with save, save-as, revert and a diff against
the shipped default. Saving the running profile hands it to `App.use_profile`, which applies
sampling changes to the next turn and asks before a reload."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from velo_chat.engine import ProfileError
from velo_chat.engine.config import (
    NAME_RE,
    Profile,
    list_profiles,
    load_profile,
    save_user_profile,
    shipped_profile,
)

from .. import keymap
from ..dialogs.message import MessageDialog, error_dialog
from ..dialogs.text_prompt import TextPrompt
from ..widgets.settings.form import ProfileForm, diff_lines
from .base import VeloScreen


class SettingsScreen(VeloScreen):
    BINDINGS = keymap.bindings("settings")
    CSS_PATH = "../../assets/styles/settings.tcss"

    def __init__(self) -> None:
        super().__init__(id="settings")
        self.names: list[str] = []

    def compose(self) -> ComposeResult:
        with Horizontal(id="settings-body"):
            with Vertical(id="profiles-pane"):
                yield Static("Profiles", classes="form-section")
                yield OptionList(id="profile-list")
                yield Static("Enter activates", classes="form-doc")
            with Vertical(id="form-pane"):
                yield Static("", id="form-title")
                yield ProfileForm(self.app.profile, cursor_blink=self.app.cursor_blink, id="profile-form")
                yield Static("", id="form-status")
        yield Footer()

    def on_mount(self) -> None:
        self._fill_list(self.app.profile.name)
        self._title()
        self.app.profile_changed.subscribe(self, self._profile_changed)
        self.query_one("#profile-list").focus()

    def _fill_list(self, highlight: str) -> None:
        lst = self.query_one("#profile-list", OptionList)
        lst.clear_options()
        running = self.app.profile.name
        self.names = []
        for info in list_profiles():
            mark = "● " if info.name == running else "  "
            lst.add_option(Option(f"{mark}{info.name} [dim]{info.source}[/]", id=info.name))
            self.names.append(info.name)
        if highlight in self.names:
            lst.highlighted = self.names.index(highlight)

    @property
    def form(self) -> ProfileForm:
        return self.query_one(ProfileForm)

    def _title(self) -> None:
        p = self.form.profile
        state = "running" if p.name == self.app.profile.name else "not running"
        self.query_one("#form-title", Static).update(f"[b]{p.name}[/b] · {state}")

    @on(OptionList.OptionHighlighted, "#profile-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        name = event.option.id
        if not name or name == self.form.profile.name:
            return
        try:
            profile = self.app.profile if name == self.app.profile.name else load_profile(name)
        except ProfileError as exc:
            self.query_one("#form-status", Static).update(f"[b $error]{exc}[/]")
            return
        self.form.load(profile)
        self._title()

    @on(OptionList.OptionSelected, "#profile-list")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.action_activate(event.option.id)

    @on(ProfileForm.Validated)
    def _validated(self, event: ProfileForm.Validated) -> None:
        status = self.query_one("#form-status", Static)
        if event.error:
            status.update(f"[b $error]{event.error.replace('[', chr(92) + '[')}[/]")
        else:
            changed = diff_lines(self.form.profile, event.profile) if event.profile else []
            status.update(f"{len(changed)} unsaved change(s) · Ctrl+S saves" if changed else "no changes")

    # -- actions ------------------------------------------------------------------------------

    def action_activate(self, name: str | None = None) -> None:
        """Run `name` and save it as the active profile once it runs; a profile whose model
        does not load leaves the running one active and nothing saved."""
        name = name or self.form.profile.name
        try:
            profile = load_profile(name)
        except ProfileError as exc:
            self.app.push_screen(error_dialog("Cannot activate", str(exc)))
            return
        self.app.use_profile(profile, activate=True)

    def _profile_changed(self, profile: Profile) -> None:
        """The running profile changed (now, or once a reload finished): mark it."""
        self._fill_list(self.form.profile.name)
        self._title()

    def _valid(self) -> Profile | None:
        profile = self.form.validate()
        if profile is None:
            self.notify(f"Not saved: {self.form.error}", severity="error")
        return profile

    def action_save(self) -> None:
        profile = self._valid()
        if profile is None:
            return
        try:
            path = save_user_profile(profile)
        except (ProfileError, OSError) as exc:
            self.app.push_screen(error_dialog("Not saved", _why(exc)))
            return
        self.form.profile = profile
        if profile.name == self.app.profile.name:
            self.app.use_profile(profile)
        self._fill_list(profile.name)
        self.form.validate()
        self.notify(f"Saved {path.name}")

    def action_save_as(self) -> None:
        if self._valid() is None:
            return

        def check(name: str) -> str | None:
            if not NAME_RE.match(name):
                return "use letters, digits, '.', '_', '-'"
            if name in self.names:
                return f"{name} exists"
            return None

        def done(name: str | None) -> None:
            if not name:
                return
            from velo_chat.engine.config import build_profile

            data, _ = self.form.collect()
            try:
                profile = build_profile(name, data)
                save_user_profile(profile)
            except (ProfileError, OSError) as exc:
                self.app.push_screen(error_dialog("Not saved", _why(exc)))
                return
            self._fill_list(name)
            self.form.load(profile)
            self._title()
            self.notify(f"Saved as {name}")

        self.app.push_screen(
            TextPrompt("Save as new profile", "", validate=check, cursor_blink=self.app.cursor_blink), done
        )

    def action_revert(self) -> None:
        name = self.form.profile.name
        try:
            profile = self.app.profile if name == self.app.profile.name else load_profile(name)
        except ProfileError as exc:
            self.app.push_screen(error_dialog("Cannot revert", str(exc)))
            return
        self.form.load(profile)
        self.notify("Reverted")

    def action_diff(self) -> None:
        current = self.form.validate() or self.form.profile
        base = shipped_profile(current.name) or Profile(name=current.name)
        lines = diff_lines(base, current)
        origin = "shipped" if shipped_profile(current.name) else "built-in defaults"
        body = "\n".join(lines) if lines else "No differences."
        self.app.push_screen(MessageDialog(f"{current.name} vs {origin}", body))

    def action_close(self) -> None:
        self.app.pop_screen()


def _why(exc: BaseException) -> str:
    """One line for a dialog: an OSError's path and reason, or the error's own message."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)
