"""Shared fixtures: the real SmolLM2 GGUF, an isolated VELO_CHAT_HOME, a loaded engine.

Engine tests use real llama.cpp on real models. What the tests write goes to temporary folders
only: `tests/support/user_dirs.py` points HOME, the XDG folders and VELO_CHAT_HOME at a
temporary folder for the whole run and fails the run if velo-chat's user folders appear there,
and each test gets its own VELO_CHAT_HOME on top. Test data kept between runs (the SmolLM2
GGUF, llama.cpp's chat templates) is cached in `.cache/test-data/` in the repo (ignored by git;
`VELO_TEST_CACHE` names another folder). SmolLM2 is copied there from the user's own velo-chat
data dir when `make test`'s bootstrap fetched it, or downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from velo_chat.engine.setup import default_model
from velo_chat.engine.engine import Engine

from devkit import data_cache
from tests.support.engine_helpers import test_profile

pytest_plugins = [
    "tests.support.user_dirs",  # HOME and the XDG folders in a temporary folder for the run
    "tests.support.store_helpers",  # the `db_path` and `store` fixtures
    "tests.support.failure_log",  # tracebacks written as failures happen (VELO_TEST_FAILURES)
]


@pytest.fixture(scope="session")
def smollm2_path(pytestconfig: pytest.Config) -> Path:
    """The verified SmolLM2-135M-Instruct GGUF in the test-data cache (copied or fetched once)."""
    from tests.support import user_dirs  # registered as a plugin above; imported here, not before

    return data_cache.smollm2(user_dirs.user_model_dir(pytestconfig))


@pytest.fixture(scope="session")
def smollm2_q8_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 requantized to Q8_0 by llama.cpp's quantizer, as `default-q8_0` makes it (once a
    run, about a second)."""
    from velo_chat.engine.setup.requantize import derived_name, requantize

    folder = tmp_path_factory.mktemp("q8_0")
    return requantize(smollm2_path, folder / derived_name(smollm2_path, "q8_0"), "q8_0")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs with its own VELO_CHAT_HOME, so nothing lands in the user's dirs."""
    home = tmp_path_factory.mktemp("velo-home")
    monkeypatch.setenv("VELO_CHAT_HOME", str(home))
    return home


@pytest.fixture
def velo_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path) -> Path:
    """An empty VELO_CHAT_HOME with the default model linked in (as if fetched)."""
    home = tmp_path / "home"
    models = home / "data" / "models"
    models.mkdir(parents=True)
    (models / smollm2_path.name).symlink_to(smollm2_path)
    monkeypatch.setenv("VELO_CHAT_HOME", str(home))
    assert default_model.is_present()
    return home


@pytest.fixture
def bare_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty VELO_CHAT_HOME with no model at all."""
    home = tmp_path / "bare"
    monkeypatch.setenv("VELO_CHAT_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def smol_engine(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One loaded SmolLM2 engine for the session; tests call `reset()` when they need cold."""
    engine = Engine(test_profile(smollm2_path), checkpoint_root=tmp_path_factory.mktemp("smol-checkpoints"))
    engine.load()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def qwen_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight qwen4exp GGUF (hybrid: GDN + sparse attention), built once.

    `VELO_TEST_QWEN` names a prebuilt one (the GPU machine has no registry to fetch SmolLM2's
    tokenizer from)."""
    prebuilt = os.environ.get("VELO_TEST_QWEN")
    if prebuilt:
        return Path(prebuilt)
    from devkit.tiny_qwen4exp import tiny_qwen4exp_path

    smollm2 = request.getfixturevalue("smollm2_path")
    return tiny_qwen4exp_path(tmp_path_factory.mktemp("tiny-qwen4exp"), smollm2)
