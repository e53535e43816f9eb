"""`velo-chat --print-config`: the resolved profile and where every file lives."""

from __future__ import annotations

from pathlib import Path

from velo_chat.engine import GGUFError, preview_thread_plan
from velo_chat.engine.config import (
    Profile,
    checkpoints_dir,
    config_dir,
    data_dir,
    database_path,
    log_path,
    profile_to_toml,
    settings_path,
    user_profiles_dir,
)
from velo_chat.engine.fit import check_profile, probe_machine
from velo_chat.engine.setup import BUILTIN, builtin_path

from .common import resolve_profile


def print_config(profile_name: str | None) -> int:
    profile = resolve_profile(profile_name)
    print(f"# config dir    {config_dir()}")
    print(f"# user profiles {user_profiles_dir()}")
    print(f"# settings      {settings_path()}")
    print(f"# data dir      {data_dir()}")
    print(f"# sessions db   {database_path()}")
    print(f"# checkpoints   {checkpoints_dir()}")
    print(f"# log           {log_path()}")
    plan, note = preview_thread_plan(profile, _model_path(profile))
    print(f"# threads       {plan.describe()}" + (f" ({note})" if note else ""))
    for line in _fit_lines(profile):
        print(f"# {line}")
    print(profile_to_toml(profile), end="")
    return 0


def _model_path(profile: Profile) -> Path | None:
    """The profile's GGUF if it is on disk (nothing is fetched here)."""
    if profile.model.path in BUILTIN:
        path = builtin_path(profile.model.path)
    else:
        path = Path(profile.model.path).expanduser()
    return path if path.is_file() else None


def _fit_lines(profile: Profile) -> list[str]:
    """The fit table for the profile's model (docs/fit.md), when its file is on disk."""
    if profile.backend.kind == "remote":
        return ["fit           a remote server runs the model: nothing is loaded here"]
    path = _model_path(profile)
    if path is None:
        return ["fit           the model file is not there yet: nothing to estimate"]
    try:
        return check_profile(profile, path, probe_machine()).table().splitlines()
    except GGUFError as exc:
        return [f"fit           {exc}"]
