"""`velo-chat --print-config`: the resolved profile and where every file lives."""

from __future__ import annotations

from pathlib import Path

from velo_chat.engine.setup import default_model
from velo_chat.engine.config import locations
from velo_chat.engine.config.profile_schema import Profile
from velo_chat.engine.config.profiles import profile_to_toml, settings_path
from velo_chat.engine.fit import machine, report
from velo_chat.engine.llama.gguf_file import GGUFError
from velo_chat.engine.scheduling.threads import preview_plan

from .common import resolve_profile


def print_config(profile_name: str | None) -> int:
    profile = resolve_profile(profile_name)
    print(f"# config dir    {locations.config_dir()}")
    print(f"# user profiles {locations.user_profiles_dir()}")
    print(f"# settings      {settings_path()}")
    print(f"# data dir      {locations.data_dir()}")
    print(f"# sessions db   {locations.database_path()}")
    print(f"# checkpoints   {locations.checkpoints_dir()}")
    print(f"# log           {locations.log_path()}")
    plan, note = preview_plan(profile, _model_path(profile))
    print(f"# threads       {plan.describe()}" + (f" ({note})" if note else ""))
    for line in _fit_lines(profile):
        print(f"# {line}")
    print(profile_to_toml(profile), end="")
    return 0


def _model_path(profile: Profile) -> Path | None:
    """The profile's GGUF if it is on disk (nothing is fetched here)."""
    if profile.model.path in default_model.BUILTIN:
        path = default_model.builtin_path(profile.model.path)
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
        return report.check(profile, path, machine.probe()).table().splitlines()
    except GGUFError as exc:
        return [f"fit           {exc}"]
