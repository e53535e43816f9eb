"""No line of llama.cpp reaches the terminal: its log (ggml's too, where a CUDA build logs its
banner when its backends start) goes to velo-chat's log file, and our callback is installed
before anything can start those backends.

On this CPU build starting the backends logs nothing, so beside the commands' stderr the tests
check the order itself: every call that starts ggml's backends runs after our callback is in
place (a CUDA build's `ggml_cuda_init: found 1 CUDA devices` is logged by the first of them)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from velo_chat.engine.config import locations

from tests.support.engine_helpers import run_cli

LLAMA_LINE = re.compile(r"llama_|ggml_|load_tensors|print_info|load:|CUDA", re.IGNORECASE)

# Runs a CLI command in a process where the calls that start ggml's backends first check that
# velo-chat's log callback is installed; the ones made before it are written to $VELO_EARLY.
WATCHED = """
import atexit, json, os, sys
from llama_cpp import llama_cpp as ll
from velo_chat.engine.llama import log as llama_log

early = []
for name in ("llama_supports_gpu_offload", "llama_print_system_info", "llama_model_load_from_file"):
    def watched(*args, _real=getattr(ll, name), _name=name):
        if not llama_log._installed:
            early.append(_name)
        return _real(*args)
    setattr(ll, name, watched)
atexit.register(lambda: open(os.environ["VELO_EARLY"], "w").write(json.dumps(early)))
from velo_chat.app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _llama_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if LLAMA_LINE.search(line)]


def test_ask_writes_no_llama_cpp_line_to_stderr_and_the_log_has_them(velo_home: Path) -> None:
    result = run_cli("ask", "--json", "--max-tokens", "4", "Hello!")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["text"]
    assert _llama_lines(result.stderr) == [] and result.stderr == ""
    logged = locations.log_path().read_text(encoding="utf-8")
    assert "load_tensors" in logged or "print_info" in logged  # routed, not lost


@pytest.mark.parametrize(
    "args",
    [
        ("ask", "--json", "--max-tokens", "2", "Hi"),
        ("--print-config",),
        ("doctor", "--json"),
    ],
    ids=["ask", "print-config", "doctor"],
)
def test_our_log_is_installed_before_any_call_that_starts_ggmls_backends(
    velo_home: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    early = tmp_path / "early.json"
    result = subprocess.run(
        [sys.executable, "-c", WATCHED, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "VELO_EARLY": str(early)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(early.read_text()) == []
    assert _llama_lines(result.stderr) == []


def test_ggml_logs_through_our_callback_once_installed() -> None:
    """ggml's own log (CUDA's init lines go through it, not llama's) is ours: `llama_log_set`
    sets both."""
    from velo_chat.engine.llama import log as llama_log

    ll = llama_log.bindings()
    ours = ctypes.cast(llama_log._installed[0], ctypes.c_void_p).value
    for getter in (ll._lib.ggml_log_get, ll._lib.llama_log_get):
        getter.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        getter.restype = None
        callback, user_data = ctypes.c_void_p(), ctypes.c_void_p()
        getter(ctypes.byref(callback), ctypes.byref(user_data))
        assert callback.value == ours, getter.__name__
