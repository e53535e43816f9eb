"""`velo-chat ask --tools` through the real CLI in subprocesses: the tiny hybrid qwen4exp with
Qwen3-Coder's template, forced calls (`tools.choice = "required"`) through the real tools in a
temporary folder. A subprocess has no terminal: edits and commands are refused unless `--yes`,
and nothing outside the folder runs even then. `--json` keeps its keys and adds `steps`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.gguf_template import with_chat_template
from tests.support.engine_helpers import pythonpath
from tests.support.llama_templates import read_template, templates_dir
from tests.test_cli import assert_user_error, message_count, session_count

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = templates_dir()
pytestmark = pytest.mark.skipif(TEMPLATES is None, reason="llama.cpp's chat templates are unavailable")
ASK_KEYS = {"text", "reasoning", "session_id", "stats"}


@pytest.fixture
def tool_model(qwen_path: Path, tmp_path: Path) -> Path:
    assert TEMPLATES is not None
    return with_chat_template(qwen_path, read_template(TEMPLATES, "Qwen3-Coder"), tmp_path / "coder.gguf")


def _profile(home: Path, model: Path, **tools: str) -> None:
    folder = home / "config" / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f'"{k}" = "{v}"' if isinstance(v, str) else f'"{k}" = {v}' for k, v in tools.items()]
    (folder / "tools.toml").write_text(
        "\n".join(
            [
                "[model]",
                f'path = "{model}"',
                "[context]",
                "n_ctx = 8192",
                "n_threads = 1",
                "[sampling]",
                "temperature = 0.7",
                "seed = 3",
                "max_tokens = 48",
                "[tools]",
                'choice = "required"',
                *lines,
            ]
        )
        + "\n"
    )


def _repo(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "notes.txt").write_text("the add function is wrong\n")
    return root


def _ask(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "velo_chat.app.cli", "ask", "--profile", "tools", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": pythonpath(REPO)},
        stdin=subprocess.DEVNULL,
        timeout=300,
    )


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "velo_chat.app.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": pythonpath(REPO)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def _export(cwd: Path, session_id: str) -> dict:
    return json.loads(_cli(cwd, "sessions", "export", session_id, "--format", "json").stdout)


def test_a_loop_without_a_terminal_runs_reads_and_refuses_the_rest(velo_home, tool_model, tmp_path):
    _profile(velo_home, tool_model)
    repo = _repo(tmp_path / "repo")
    proc = _ask(repo, "--tools", "--max-steps", "2", "--json", "The add function is wrong; fix it.")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert ASK_KEYS <= set(out) and "steps" in out
    assert [s["step"] for s in out["steps"]] == [1, 2]
    assert out["stats"] == out["steps"][-1]["stats"]  # the last step's
    assert "tools.max_steps (2)" in proc.stderr
    for step in out["steps"]:
        assert step["calls"], step
        for call in step["calls"]:
            assert call["decision"] in ("auto", "refused", "invalid"), call
    data = _export(repo, out["session_id"])
    results = [r for m in data["messages"] for r in m.get("tool_results", [])]
    assert results
    for result in results:
        if result["decision"] == "refused":  # nobody at a terminal: the model is told why
            assert "without a terminal" in result["content"]
        if result["decision"] == "auto":
            assert result["tool"] in ("read_file", "list_files", "search")
    assert (repo / "src" / "app.py").read_text() == "def add(a, b):\n    return a - b\n" or any(
        r["tool"] in ("edit_file", "write_file") and r["decision"] != "refused" for r in results
    )
    # `sessions show` lists each call under its reply, with what came of it
    shown = _cli(repo, "sessions", "show", out["session_id"]).stdout.splitlines()
    calls = [line for line in shown if line.startswith("🔧 ")]
    assert calls and len(calls) == sum(len(m.get("tool_calls", [])) for m in data["messages"])
    refused = [r for r in results if r["decision"] == "refused"]
    assert sum("· refused: " in line for line in calls) == len(refused)


def test_yes_allows_edits_and_commands_in_the_folder_only(velo_home, tool_model, tmp_path):
    _profile(velo_home, tool_model, approve="none")
    repo = _repo(tmp_path / "repo")
    proc = _ask(repo, "--tools", "--yes", "--max-steps", "2", "--json", "Fix the add function.")
    assert proc.returncode == 0, proc.stderr
    data = _export(repo, json.loads(proc.stdout)["session_id"])
    results = [r for m in data["messages"] for r in m.get("tool_results", [])]
    assert results
    for result in results:
        if result["decision"] == "refused":
            assert result["details"].get("outside"), result  # --yes never covers outside
        else:
            assert result["decision"] in ("auto", "invalid"), result


def test_a_template_without_tools_refuses_them_in_one_line(velo_home, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "velo_chat.app.cli", "ask", "--tools", "hi"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": pythonpath(REPO)},
        timeout=300,
    )
    assert_user_error(proc, "no tool support")
    assert session_count(velo_home) == 0 and message_count(velo_home) == 0


def test_a_bad_tools_setting_is_one_line(velo_home, tool_model, tmp_path):
    _profile(velo_home, tool_model, offered="read_file, teleport")
    proc = _ask(tmp_path, "--tools", "hi")
    assert_user_error(proc, "tools.offered", "teleport")
    assert session_count(velo_home) == 0
