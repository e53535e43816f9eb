"""Configuration: where files live, the profile schema, profile files and `settings.toml`.

What the app uses is exported here (`locations` says where each file is, `profiles` reads and
writes profiles, `profile_schema` declares every setting); nothing here imports llama.cpp.
"""

from ..atomic_file import atomic_write, atomic_write_text
from ..llama.log import setup_file_logging
from .locations import (
    checkpoints_dir,
    config_dir,
    create_private,
    data_dir,
    database_path,
    exports_dir,
    log_path,
    user_profiles_dir,
)
from .profile_schema import (
    SECTIONS,
    AttachmentSettings,
    ToolSettings,
    Profile,
    ReasoningSettings,
    SamplingSettings,
    SpeculationSettings,
    value_type,
)
from .profiles import (
    NAME_RE,
    active_profile_name,
    build_profile,
    list_profiles,
    load_profile,
    profile_to_toml,
    save_user_profile,
    set_active_profile,
    settings_path,
    shipped_profile,
)

__all__ = [
    # where files live
    "checkpoints_dir",
    "config_dir",
    "create_private",
    "data_dir",
    "database_path",
    "exports_dir",
    "log_path",
    "user_profiles_dir",
    "atomic_write",
    "atomic_write_text",
    "setup_file_logging",
    # the schema
    "SECTIONS",
    "AttachmentSettings",
    "ToolSettings",
    "Profile",
    "ReasoningSettings",
    "SamplingSettings",
    "SpeculationSettings",
    "value_type",
    # profile files and settings.toml
    "NAME_RE",
    "active_profile_name",
    "build_profile",
    "list_profiles",
    "load_profile",
    "profile_to_toml",
    "save_user_profile",
    "set_active_profile",
    "settings_path",
    "shipped_profile",
]
