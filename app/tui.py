"""Start the TUI with the active (or the named) profile: the app itself is `app.py`."""

from __future__ import annotations

from velo_chat.engine.config import active_profile_name, load_profile


def run_tui(profile_name: str | None) -> int:
    from .app import make_app

    profile = load_profile(profile_name or active_profile_name())
    make_app(profile).run()
    return 0
