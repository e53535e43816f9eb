"""The profile form: every field of a profile, grouped by section, each with its doc text,
validated as typed through the engine's own `build_profile` (so the form can never accept what
the loader would refuse). It posts `Validated` up; the settings screen saves.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from rich.markup import escape
from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Input, Select, Static, Switch

from velo_chat.engine import ProfileError
from velo_chat.engine.config import SECTIONS, Profile, build_profile, value_type

TOP = ("description", "system_prompt")
TOP_DOCS = {
    "description": "One line shown in the profile list.",
    "system_prompt": "The system message new sessions on this profile start with.",
}
SECTION_TITLES = {
    "model": "Model",
    "context": "Context & memory",
    "sampling": "Sampling",
    "reasoning": "Reasoning",
    "speculation": "Speculation",
    "checkpoints": "Checkpoints",
    "display": "Display",
}


def field_id(key: str) -> str:
    return "f-" + key.replace(".", "--")


def profile_values(profile: Profile) -> dict[str, Any]:
    """Flat `section.field` -> value (top-level keys have no section)."""
    out: dict[str, Any] = {k: getattr(profile, k) for k in TOP}
    for section in SECTIONS:
        values = getattr(profile, section)
        for f in dataclasses.fields(values):
            out[f"{section}.{f.name}"] = getattr(values, f.name)
    return out


def diff_lines(old: Profile, new: Profile) -> list[str]:
    a, b = profile_values(old), profile_values(new)
    return [f"{k}: {a[k]!r} → {b[k]!r}" for k in a if a[k] != b[k]]


class ProfileForm(VerticalScroll):
    @dataclass
    class Validated(Message):
        profile: Profile | None
        error: str | None

    def __init__(self, profile: Profile, *, cursor_blink: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.profile = profile
        self.cursor_blink = cursor_blink
        self.result: Profile | None = profile
        self.error: str | None = None
        self._kinds: dict[str, type] = {}
        self._auto: set[str] = set()  # fields that also accept "auto"

    def compose(self) -> ComposeResult:
        values = profile_values(self.profile)
        yield Static("General", classes="form-section")
        for key in TOP:
            self._kinds[key] = str
            yield from self._row(key, str, values[key], TOP_DOCS[key], None)
        for section, cls in SECTIONS.items():
            yield Static(SECTION_TITLES.get(section, section), classes="form-section")
            for f in dataclasses.fields(cls):
                key = f"{section}.{f.name}"
                kind = value_type(f)
                self._kinds[key] = kind
                if f.metadata.get("auto"):
                    self._auto.add(key)
                doc = escape(f.metadata.get("doc", ""))  # "[model]" is text, not a style
                if f.metadata.get("reload"):
                    doc += f" [dim](needs a {f.metadata['reload']} reload)[/]"
                yield from self._row(key, kind, values[key], doc, f.metadata.get("choices"))

    def _row(self, key: str, kind: type, value: Any, doc: str, choices) -> ComposeResult:
        yield Static(f"[b]{key}[/b]", classes="form-label")
        fid = field_id(key)
        if kind is bool:
            yield Switch(bool(value), id=fid)
        elif choices:
            yield Select([(c, c) for c in choices], value=value, allow_blank=False, id=fid)
        else:
            box = Input(str(value), id=fid)
            box.cursor_blink = self.cursor_blink
            yield box
        yield Static(doc, classes="form-doc")
        yield Static("", id=f"{fid}-error", classes="form-error")

    # -- values -------------------------------------------------------------------------------

    def load(self, profile: Profile) -> None:
        """Show another profile's values (revert, or a different profile highlighted)."""
        self.profile = profile
        for key, value in profile_values(profile).items():
            widget = self._field(key)
            if isinstance(widget, Switch):
                widget.value = bool(value)
            elif isinstance(widget, Select):
                widget.value = value
            else:
                widget.value = str(value)
        self.validate()

    def _field(self, key: str) -> Switch | Select[Any] | Input:
        widget = self.query_one(f"#{field_id(key)}")
        assert isinstance(widget, (Switch, Select, Input)), widget  # what `_row` made
        return widget

    def collect(self) -> tuple[dict[str, Any], dict[str, str]]:
        data: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for key, kind in self._kinds.items():
            raw: Any = self._field(key).value  # bool (Switch), a choice (Select), str (Input)
            value: Any
            try:
                if key in self._auto and raw.strip() == "auto":
                    value = "auto"
                else:
                    value = kind(raw.strip()) if kind in (int, float) else raw
            except ValueError:
                what = "a whole number" if kind is int else "a number"
                errors[key] = f"{key} must be {what}" + (' or "auto"' if key in self._auto else "")
                continue
            if "." in key:
                section, name = key.split(".", 1)
                data.setdefault(section, {})[name] = value
            else:
                data[key] = value
        return data, errors

    def validate(self) -> Profile | None:
        data, errors = self.collect()
        result = None
        if not errors:
            try:
                result = build_profile(self.profile.name, data)
            except ProfileError as exc:
                message = str(exc)
                hit = next((k for k in re.findall(r"[a-z_]+\.[a-z_0-9]+", message) if k in self._kinds), None)
                errors[hit or "description"] = message
        for key in self._kinds:
            box = self.query_one(f"#{field_id(key)}-error", Static)
            box.update(errors.get(key, "").replace("[", r"\["))
            self.query_one(f"#{field_id(key)}").set_class(key in errors, "-invalid")
        self.result = result
        self.error = next(iter(errors.values()), None)
        self.post_message(self.Validated(result, self.error))
        return result

    @on(Input.Changed)
    @on(Switch.Changed)
    @on(Select.Changed)
    def _changed(self, event: Message) -> None:
        event.stop()
        if self.is_mounted and self._kinds:
            self.validate()
