"""Which engine a profile runs on: llama.cpp in this process, or a remote server.

The app and the CLI make engines only through `make_engine`, and use them only through
`EngineAPI`, so the two backends are interchangeable everywhere a turn runs.
"""

from __future__ import annotations

from pathlib import Path

from .api import EngineAPI
from .config.profile_schema import Profile


def make_engine(
    profile: Profile, *, model_path: str | Path | None = None, checkpoint_root: Path | None = None
) -> EngineAPI:
    """An engine for `profile` (not loaded yet). `model_path` overrides a local profile's model."""
    if profile.backend.kind == "remote":
        from .remote.engine import RemoteEngine

        return RemoteEngine(profile)
    from .engine import Engine

    return Engine(profile, model_path=model_path, checkpoint_root=checkpoint_root)
