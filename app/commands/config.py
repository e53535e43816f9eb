"""`velo-chat --print-config`: the resolved profile and where every file lives."""

from __future__ import annotations

from pathlib import Path

from velo_chat.engine.setup import default_model
from velo_chat.engine.config import locations
from velo_chat.engine.config.profile_schema import Profile
from velo_chat.engine.config.profiles import profile_to_toml, settings_path
from velo_chat.engine.threads import preview_plan

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
    print(profile_to_toml(profile), end="")
    return 0


def _model_path(profile: Profile) -> Path | None:
    """The profile's GGUF if it is on disk (nothing is fetched here)."""
    if profile.model.path == "default":
        path = default_model.default_model_path()
    else:
        path = Path(profile.model.path).expanduser()
    return path if path.is_file() else None
