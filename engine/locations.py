"""Where velo-chat keeps its files, in one place.

Every directory is created on first use by the function that returns it; nothing here touches the
disk at import time. `VELO_CHAT_HOME` puts all of them under one folder (the tests use it);
otherwise they are the platformdirs user directories for "velo-chat".
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "velo-chat"
HOME_ENV = "VELO_CHAT_HOME"


def _home() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    """User profiles (`profiles/*.toml`) and settings."""
    home = _home()
    return _ensure(home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME)))


def data_dir() -> Path:
    """The session database and the embedded default model."""
    home = _home()
    return _ensure(home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME)))


def cache_dir() -> Path:
    """Checkpoints (the disk tier) and anything else that can be rebuilt."""
    home = _home()
    return _ensure(home / "cache" if home else Path(platformdirs.user_cache_dir(APP_NAME)))


def log_dir() -> Path:
    """`velo-chat.log`, including llama.cpp's own log lines."""
    home = _home()
    return _ensure(home / "logs" if home else Path(platformdirs.user_log_dir(APP_NAME)))


def models_dir() -> Path:
    return _ensure(data_dir() / "models")


def user_profiles_dir() -> Path:
    return _ensure(config_dir() / "profiles")


def checkpoints_dir() -> Path:
    return _ensure(cache_dir() / "checkpoints")


def database_path() -> Path:
    return data_dir() / "sessions.sqlite3"


def log_path() -> Path:
    return log_dir() / "velo-chat.log"
