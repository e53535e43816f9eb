"""`velo-chat --print-config`: the resolved profile and where every file lives."""

from __future__ import annotations

from velo_chat.engine import locations
from velo_chat.engine.profiles import profile_to_toml, settings_path

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
    print(profile_to_toml(profile), end="")
    return 0
