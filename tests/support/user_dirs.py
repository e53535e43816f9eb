"""A test run never writes to the user's own velo-chat folders (a pytest plugin).

Before collection, `HOME` and the XDG base directories (`XDG_CONFIG_HOME`, `XDG_DATA_HOME`,
`XDG_CACHE_HOME`, `XDG_STATE_HOME`) point into a fresh temporary folder, so platformdirs (the
folders velo-chat uses when `VELO_CHAT_HOME` is unset) resolves there, in this process and in
every `velo-chat` subprocess a test starts. `VELO_CHAT_HOME` points at another temporary folder
for the session fixtures; each test gets its own on top (`isolated_home` in conftest.py).

At the end the run fails if anything appeared in velo-chat's folders under that fake home:
that is code which ignored `VELO_CHAT_HOME` and, outside the tests, would have written to the
user's real folders. Checking the fake home rather than the real folders keeps the verdict
independent of whatever else runs on the machine (a real velo-chat writing its log meanwhile).

pip keeps working: a user pip configuration found under the real home (a mirror, a
certificate) is handed on as `PIP_CONFIG_FILE` unless that is already set.

Test data kept between runs lives in `devkit/data_cache.py`'s folder; `VELO_TEST_CACHE`, if set, is
made absolute here while `~` still means the user's home.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import platformdirs
import pytest

from velo_chat.engine.config.locations import APP_NAME, HOME_ENV

from devkit.data_cache import CACHE_ENV

_FAKE_ROOT = pytest.StashKey[Path]()
_PATCH = pytest.StashKey[pytest.MonkeyPatch]()
_USER_MODEL_DIR = pytest.StashKey[Path]()

_XDG = {
    "XDG_CONFIG_HOME": ".config",
    "XDG_DATA_HOME": ".local/share",
    "XDG_CACHE_HOME": ".cache",
    "XDG_STATE_HOME": ".local/state",
}


def user_model_dir(config: pytest.Config) -> Path | None:
    """Where the user's own velo-chat keeps the default model (read, never written: the
    tests copy a verified model from there instead of downloading it again)."""
    return config.stash.get(_USER_MODEL_DIR, None)


def _velo_chat_dirs() -> list[Path]:
    """velo-chat's platformdirs folders, as the current environment resolves them."""
    return [
        Path(platformdirs.user_config_dir(APP_NAME)),
        Path(platformdirs.user_data_dir(APP_NAME)),
        Path(platformdirs.user_cache_dir(APP_NAME)),
        Path(platformdirs.user_state_dir(APP_NAME)),
        Path(platformdirs.user_log_dir(APP_NAME)),
    ]


def _user_pip_config() -> Path | None:
    """The user's pip configuration under the real home (the one pip would read last)."""
    home = Path.home()
    candidates = [home / ".pip" / "pip.conf", Path(platformdirs.user_config_dir("pip")) / "pip.conf"]
    found = [p for p in candidates if p.is_file()]
    return found[-1] if found else None


def pytest_configure(config: pytest.Config) -> None:
    # What the real environment says, before it is replaced.
    home = os.environ.get(HOME_ENV)
    real_data = Path(home).expanduser() / "data" if home else Path(platformdirs.user_data_dir(APP_NAME))
    config.stash[_USER_MODEL_DIR] = real_data / "models"
    pip_config = _user_pip_config()
    cache = os.environ.get(CACHE_ENV)

    root = Path(tempfile.mkdtemp(prefix="velo-test-home-"))
    patch = pytest.MonkeyPatch()
    fake = root / "home"
    patch.setenv("HOME", str(fake))
    for var, sub in _XDG.items():
        patch.setenv(var, str(fake / sub))
    patch.setenv(HOME_ENV, str(root / "session-home"))
    if cache:  # made absolute while `~` still means the user's home
        patch.setenv(CACHE_ENV, str(Path(cache).expanduser().resolve()))
    if pip_config is not None and "PIP_CONFIG_FILE" not in os.environ:
        patch.setenv("PIP_CONFIG_FILE", str(pip_config))
    config.stash[_FAKE_ROOT] = root
    config.stash[_PATCH] = patch


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if _FAKE_ROOT not in session.config.stash:
        return
    leaked = [p for p in _velo_chat_dirs() if p.exists()]
    if not leaked:
        return
    entries = sorted(str(f) for d in leaked for f in d.rglob("*"))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [
        "velo-chat's user folders were written during the tests (code that ignores VELO_CHAT_HOME; "
        "outside the tests this lands in the user's real folders):",
        *(f"  {d}" for d in leaked),
        *(f"    {f}" for f in entries[:20]),
    ]
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "user folders written", red=True)
        for line in lines:
            reporter.write_line(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    patch = config.stash.get(_PATCH, None)
    if patch is not None:
        patch.undo()
    root = config.stash.get(_FAKE_ROOT, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
