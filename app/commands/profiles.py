"""`velo-chat profiles list|show`."""

from __future__ import annotations

import argparse

from velo_chat.engine.config import (
    active_profile_name,
    list_profiles,
    load_profile,
    profile_to_toml,
)


def run(args: argparse.Namespace) -> int:
    if args.profiles_command == "list":
        active = active_profile_name()
        for info in list_profiles():
            mark = "*" if info.name == active else " "
            print(f"{mark} {info.name:<20} {info.source:<13} {info.description}")
        return 0
    print(profile_to_toml(load_profile(args.name)), end="")
    return 0
