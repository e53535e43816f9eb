"""Helpers for engine and CLI tests: a small test profile and running the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any
from pathlib import Path

from velo_chat.engine.config.profile_schema import Profile
from velo_chat.engine.config.profiles import build_profile


def test_profile(model_path: Path, **sections: dict) -> Profile:
    """A small, fast profile for engine tests (2 threads: more than the cores is 35x slower).

    Fixed threads, no adaptation to the machine's load: CPU flash attention splits a long KV
    cache by the decode thread count, so greedy tokens compared across runs must be computed
    with the same count (docs/threads.md)."""
    data: dict[str, dict[str, Any]] = {
        "model": {"path": str(model_path)},
        "context": {"n_ctx": 2048, "n_batch": 256, "n_ubatch": 64, "n_threads": 2, "adapt_threads": False},
        "sampling": {"temperature": 0.0, "max_tokens": 64},
        # Short test prompts: save the state before every reply, however short the prefill.
        "checkpoints": {"min_prefill_tokens": 0},
    }
    gpu_layers = os.environ.get("VELO_TEST_GPU_LAYERS")  # the GPU machine runs these on CUDA
    if gpu_layers:
        data["model"]["n_gpu_layers"] = int(gpu_layers)
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return build_profile("test", data)


test_profile.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def pythonpath(*first: str | Path) -> str:
    """A subprocess's PYTHONPATH: `first`, then this process's own. Replacing it instead would
    lose velo-chat where it is importable only through PYTHONPATH (the GPU machine's suite
    runs it from a folder of links, not an installed package)."""
    paths = [str(p) for p in first] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join(p for p in paths if p)


def run_cli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the real `velo-chat` console entry point in a subprocess."""
    return _run(args, env, stdin, timeout, text=True)


def run_cli_bytes(
    *args: str | bytes, env: dict[str, str] | None = None, stdin: bytes | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[bytes]:
    """`run_cli` with bytes: arguments and stdin that are not UTF-8 (as a shell passes them),
    and stdout/stderr undecoded, so a test sees exactly what the CLI wrote."""
    return _run(args, env, stdin, timeout, text=False)


def _run(args, env, stdin, timeout, *, text: bool):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "velo_chat.app.cli", *args],
        capture_output=True,
        text=text,
        env=full_env,
        input=stdin,
        timeout=timeout,
    )
