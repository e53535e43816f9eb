"""App-level settings (not profile settings): the `keymap` table in settings.toml.

settings.toml is shared with `engine/config/profiles.py`, which owns its `active_profile` line; this
module only reads the `[keymap]` table (binding id -> keys, e.g. `"session.new" = "ctrl+g"`).
An unknown id or a non-string value is reported, not fatal: a typo must not stop the app.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from velo_chat.engine.config import settings_path

from .keymap import BY_ID


@dataclass(frozen=True)
class AppSettings:
    keymap: dict[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # shown once as a notification


def load_app_settings(path: Path | None = None) -> AppSettings:
    path = path or settings_path()
    if not path.exists():
        return AppSettings()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return AppSettings(problems=(f"cannot read {path.name}: {exc}",))
    raw = data.get("keymap", {})
    if not isinstance(raw, dict):
        return AppSettings(problems=(f"{path.name}: [keymap] must be a table",))
    keymap: dict[str, str] = {}
    problems = []
    for key, value in raw.items():
        if key not in BY_ID:
            problems.append(f"{path.name}: unknown binding id keymap.{key}")
        elif not isinstance(value, str) or not value.strip():
            problems.append(f'{path.name}: keymap.{key} must be a key string like "ctrl+g"')
        else:
            keymap[key] = value.strip()
    return AppSettings(keymap=keymap, problems=tuple(problems))
