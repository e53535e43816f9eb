"""The test run is kept away from the user's own folders (tests/support/user_dirs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from velo_chat.engine.config import locations

from devkit.data_cache import cache_dir
from tests.support.engine_helpers import run_cli


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def test_user_folders_resolve_into_the_runs_temporary_home():
    fake_home = Path(os.environ["HOME"])
    assert fake_home.name == "home" and fake_home.parent.name.startswith("velo-test-home-")
    for folder in (
        platformdirs.user_config_dir(locations.APP_NAME),
        platformdirs.user_data_dir(locations.APP_NAME),
        platformdirs.user_cache_dir(locations.APP_NAME),
        platformdirs.user_log_dir(locations.APP_NAME),
    ):
        assert _inside(Path(folder), fake_home), folder


def test_every_test_has_its_own_velo_chat_home(isolated_home):
    assert Path(os.environ[locations.HOME_ENV]) == isolated_home
    assert _inside(locations.data_dir(), isolated_home)
    assert _inside(locations.log_dir(), isolated_home)


def test_a_cli_subprocess_writes_under_the_tests_home(isolated_home):
    result = run_cli("--print-config")
    assert result.returncode == 0, result.stderr
    assert str(isolated_home) in result.stdout
    assert (isolated_home / "config").is_dir()


def test_the_test_data_cache_is_outside_the_user_folders():
    cache = cache_dir()
    assert cache.is_dir()
    assert not _inside(cache, Path(os.environ["HOME"]))
    assert os.environ.get("VELO_TEST_CACHE") or _inside(cache, Path(__file__).parent.parent / ".cache")
