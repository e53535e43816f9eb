"""Loading, validating and saving profiles (the schema lives in `engine/config/profile_schema.py`).

Profiles ship in `velo_chat/assets/profiles/*.toml`; user profiles live in the config dir's
`profiles/`. A user file with the same name as a shipped one *overlays* it: only the keys it sets
change, so a user can copy `spark-qwen38` down to its `[model] path` line. Every value is checked
against its declaration and rejected with the field name and the allowed range.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import math
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from . import locations
from ..atomic_file import atomic_write_text
from ..errors import ProfileError
from .profile_schema import SECTIONS, Profile, value_type

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TOP_LEVEL_KEYS = ("description", "system_prompt")


@dataclass(frozen=True)
class ProfileInfo:
    name: str
    source: str  # "shipped", "user", or "user+shipped" (a user overlay of a shipped profile)
    description: str


def _shipped_dir() -> importlib.resources.abc.Traversable:
    return importlib.resources.files("velo_chat.assets").joinpath("profiles")


def _shipped_texts() -> dict[str, str]:
    out = {}
    for entry in _shipped_dir().iterdir():
        if entry.name.endswith(".toml"):
            out[entry.name[: -len(".toml")]] = entry.read_text(encoding="utf-8")
    return out


def _user_paths() -> dict[str, Path]:
    """The user's profile files. A profiles folder that cannot be used (a file in its place,
    no permission) hides the user profiles with a logged warning: the shipped ones still work,
    and saving says what is wrong."""
    try:
        return {p.stem: p for p in sorted(locations.user_profiles_dir().glob("*.toml"))}
    except OSError as exc:
        log.warning("cannot read the user profiles: %s", exc)
        return {}


def _parse_toml(name: str, text: str, origin: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {name!r} ({origin}): invalid TOML: {exc}") from None


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _check_value(profile: str, where: str, f: dataclasses.Field, value: Any) -> Any:
    meta = f.metadata
    if meta.get("auto") and value == "auto":
        return value
    want = value_type(f)
    ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        also = ' or "auto"' if meta.get("auto") else ""
        raise ProfileError(f"profile {profile!r}: {where} must be {want.__name__}{also}, got {value!r}")
    if want is float and not math.isfinite(value):
        raise ProfileError(f"profile {profile!r}: {where} must be a finite number, got {value!r}")
    lo, hi, choices = meta.get("min"), meta.get("max"), meta.get("choices")
    if choices and value not in choices:
        raise ProfileError(f"profile {profile!r}: {where} must be one of {', '.join(choices)}; got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bound = (
            f"at least {lo}" if hi is None else f"at most {hi}" if lo is None else f"between {lo} and {hi}"
        )
        raise ProfileError(f"profile {profile!r}: {where} must be {bound}; got {value!r}")
    return value


def build_profile(name: str, data: dict[str, Any]) -> Profile:
    """Validate parsed TOML data and build a frozen Profile; unknown keys are errors."""
    if not NAME_RE.match(name):
        raise ProfileError(f"invalid profile name {name!r}: use letters, digits, '.', '_', '-'")
    top: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    for key, value in data.items():
        if key in TOP_LEVEL_KEYS:
            if not isinstance(value, str):
                raise ProfileError(f"profile {name!r}: {key} must be a string")
            top[key] = value
        elif key in SECTIONS:
            if not isinstance(value, dict):
                raise ProfileError(f"profile {name!r}: [{key}] must be a table")
            cls = SECTIONS[key]
            known = {f.name: f for f in fields(cls)}
            kwargs = {}
            for field_name, field_value in value.items():
                if field_name not in known:
                    raise ProfileError(
                        f"profile {name!r}: unknown setting {key}.{field_name} (known: {', '.join(known)})"
                    )
                kwargs[field_name] = _check_value(name, f"{key}.{field_name}", known[field_name], field_value)
            sections[key] = cls(**kwargs)
        else:
            raise ProfileError(
                f"profile {name!r}: unknown key {key!r} (known: {', '.join((*TOP_LEVEL_KEYS, *SECTIONS))})"
            )
    profile = Profile(name=name, **top, **sections)
    validate_profile(profile)
    return profile


def validate_profile(profile: Profile) -> None:
    """Checks that span fields; each field's own range is checked when it is parsed."""
    backend = profile.backend
    if backend.kind == "remote" and not backend.base_url.startswith(("http://", "https://")):
        raise ProfileError(
            f"profile {profile.name!r}: backend.base_url must be an http:// or https:// URL "
            f"for a remote backend (got {backend.base_url!r})"
        )
    ctx = profile.context
    if ctx.n_ubatch > ctx.n_batch:
        raise ProfileError(
            f"profile {profile.name!r}: context.n_ubatch ({ctx.n_ubatch}) must not exceed "
            f"context.n_batch ({ctx.n_batch})"
        )
    spec = profile.speculation
    if spec.enabled and spec.max_draft + 1 > min(ctx.n_ubatch, ctx.n_batch):
        raise ProfileError(
            f"profile {profile.name!r}: speculation.max_draft ({spec.max_draft}) plus one must fit "
            f"context.n_ubatch ({ctx.n_ubatch}): a draft is verified in one batch"
        )
    if profile.context.type_v not in ("f16", "f32", "bf16") and ctx.flash_attn == "off":
        raise ProfileError(
            f"profile {profile.name!r}: a quantized context.type_v needs context.flash_attn on"
        )


def list_profiles() -> list[ProfileInfo]:
    shipped = _shipped_texts()
    user = _user_paths()
    infos = []
    for name in sorted(set(shipped) | set(user)):
        source = (
            "user+shipped" if name in shipped and name in user else ("user" if name in user else "shipped")
        )
        try:
            description = load_profile(name).description
        except ProfileError as exc:
            description = f"(invalid: {exc})"
        infos.append(ProfileInfo(name=name, source=source, description=description))
    return infos


def load_profile(name: str) -> Profile:
    """The named profile: the shipped file overlaid by the user's file of the same name."""
    shipped = _shipped_texts()
    user = _user_paths()
    if name not in shipped and name not in user:
        known = ", ".join(sorted(set(shipped) | set(user)))
        raise ProfileError(f"unknown profile {name!r} (known: {known})")
    data: dict[str, Any] = {}
    if name in shipped:
        data = _parse_toml(name, shipped[name], "shipped")
    if name in user:
        try:
            text = user[name].read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"profile {name!r}: cannot read {user[name]}: {exc}") from None
        data = _overlay(data, _parse_toml(name, text, str(user[name])))
    return build_profile(name, data)


def shipped_profile(name: str) -> Profile | None:
    """The shipped version of a profile (for a diff against the default), if there is one."""
    text = _shipped_texts().get(name)
    return None if text is None else build_profile(name, _parse_toml(name, text, "shipped"))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def profile_to_toml(profile: Profile) -> str:
    """The full profile as TOML, every field written (what `--print-config` shows)."""
    lines = [f"# profile {profile.name}"]
    for key in TOP_LEVEL_KEYS:
        lines.append(f"{key} = {_toml_value(getattr(profile, key))}")
    for section in SECTIONS:
        lines.append("")
        lines.append(f"[{section}]")
        values = getattr(profile, section)
        for f in fields(values):
            lines.append(f"{f.name} = {_toml_value(getattr(values, f.name))}")
    return "\n".join(lines) + "\n"


def save_user_profile(profile: Profile) -> Path:
    """Write a profile to the user dir atomically (temp file + rename) and return its path."""
    validate_profile(profile)
    target = locations.user_profiles_dir() / f"{profile.name}.toml"
    return atomic_write_text(target, profile_to_toml(profile))


def settings_path() -> Path:
    return locations.config_dir() / "settings.toml"


def active_profile_name() -> str:
    """The profile the TUI and `ask` use when none is named (settings.toml, else "default")."""
    path = settings_path()
    if not path.exists():
        return "default"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"cannot read {path}: {exc}") from None
    name = data.get("active_profile", "default")
    if not isinstance(name, str):
        raise ProfileError(f"{path}: active_profile must be a string")
    return name


def set_active_profile(name: str) -> None:
    """Make `name` the active profile (checked to exist and be valid), keeping the rest of
    settings.toml as it was."""
    load_profile(name)
    path = settings_path()
    lines = []
    if path.exists():
        lines = [
            ln
            for ln in path.read_text(encoding="utf-8").splitlines()
            if not ln.strip().startswith("active_profile")
        ]
    text = "\n".join([f"active_profile = {_toml_value(name)}", *lines]).rstrip() + "\n"
    atomic_write_text(path, text)
