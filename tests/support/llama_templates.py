"""llama.cpp's collection of real chat templates (`models/templates/*.jinja`) for template tests.

The templates ship in the llama-cpp-python sdist that `make bootstrap` builds the engine from
(`vendor/llama.cpp/models/templates/`), but pip deletes the unpacked sdist after the build, so the
first test run extracts them into the test-data cache (`devkit/data_cache.py`, beside the SmolLM2 model)
and later runs read them from there. Sources, in order:
- `VELO_TEST_LLAMA_TEMPLATES`: a folder of `*.jinja` files, or the sdist `.tar.gz`;
- the extracted copy from an earlier run;
- pip's HTTP cache, when it kept the sdist the bootstrap downloaded;
- `pip download` of the same sdist (the registry fetch the bootstrap made).
`templates_dir()` returns None only when none of these works (no network, no cache); the tests
then skip with that reason.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from devkit.data_cache import cache_dir

log = logging.getLogger(__name__)

ENV = "VELO_TEST_LLAMA_TEMPLATES"
_MEMBER_DIR = "vendor/llama.cpp/models/templates/"


def llama_version() -> str:
    return importlib.metadata.version("llama_cpp_python")


def _cache_dir(version: str) -> Path:
    return cache_dir() / f"llama-cpp-python-{version}-templates"


def _extract(sdist: Path, dest: Path) -> bool:
    """Copy the templates out of an sdist into dest (atomically: a temp dir, then a rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".templates-"))
    try:
        n = 0
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar:
                name = member.name.split("/", 1)[-1]
                if member.isfile() and name.startswith(_MEMBER_DIR) and name.endswith(".jinja"):
                    source = tar.extractfile(member)
                    if source is not None:
                        (tmp / Path(name).name).write_bytes(source.read())
                        n += 1
        if n == 0:
            return False
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        return True
    except (OSError, tarfile.TarError) as exc:
        log.warning("cannot read templates from %s: %s", sdist, exc)
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _is_sdist(path: Path, version: str) -> bool:
    try:
        with path.open("rb") as f:
            if f.read(2) != b"\x1f\x8b":
                return False
        with tarfile.open(path, "r:gz") as tar:
            first = tar.next()
        return first is not None and first.name.startswith(f"llama_cpp_python-{version}")
    except (OSError, tarfile.TarError, EOFError):
        return False


def _from_pip_cache(version: str) -> Path | None:
    """The sdist in pip's HTTP cache (bodies are stored as files next to their metadata)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "cache", "dir"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    root = Path(out) / "http-v2"
    if not out or not root.is_dir():
        return None
    for body in root.rglob("*.body"):
        if body.stat().st_size > 10 * 2**20 and _is_sdist(body, version):
            return body
    return None


def _download(version: str, into: Path) -> Path | None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"llama-cpp-python=={version}",
        "-d",
        str(into),
    ]
    try:
        subprocess.run(cmd, capture_output=True, timeout=900, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("pip download of the llama-cpp-python sdist failed: %s", exc)
        return None
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    return found[0] if found else None


def templates_dir() -> Path | None:
    """A folder of llama.cpp's `*.jinja` chat templates for the installed llama-cpp-python."""
    version = llama_version()
    explicit = os.environ.get(ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_dir():
            return path
        dest = _cache_dir(version + "-env")
        return dest if _extract(path, dest) else None
    dest = _cache_dir(version)
    if dest.is_dir() and any(dest.glob("*.jinja")):
        return dest
    cached = _from_pip_cache(version)
    if cached is not None and _extract(cached, dest):
        return dest
    with tempfile.TemporaryDirectory(prefix="velo-llama-sdist-") as tmp:
        sdist = _download(version, Path(tmp))
        if sdist is not None and _extract(sdist, dest):
            return dest
    return None


def read_template(folder: Path, name: str) -> str:
    return (folder / f"{name}.jinja").read_text(encoding="utf-8")
