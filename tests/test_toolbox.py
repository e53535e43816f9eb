"""The file tools (app/tools/): paths in and out of the working folder, calls checked before they
run, reading, listing, searching (with and without ripgrep), editing and writing, on real files
in a temporary folder."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from velo_chat.app.tools import ToolBox, Workspace, find_tools
from velo_chat.app.tools.find_tools import glob_matcher
from velo_chat.engine import ToolCall
from velo_chat.engine.config import ToolSettings

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
needs_rg = pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep is not installed")


def call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(name, arguments)


def write(root: Path, rel: str, text: str = "") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    write(folder, "src/app.py", "import os\n\ndef main():\n    return os.getcwd()\n")
    write(folder, "src/util/helpers.py", "def helper():\n    return 'main'\n")
    write(folder, "README.md", "# Project\nrun main\n")
    write(folder, ".hidden/secret.txt", "main\n")
    write(folder, "node_modules/pkg/index.js", "main()\n")
    return folder


def box(root: Path, **settings: object) -> ToolBox:
    return ToolBox(root, ToolSettings(**settings))  # type: ignore[arg-type]


def run(tools: ToolBox, tool_call: ToolCall):
    prepared = tools.prepare(tool_call)
    return prepared, tools.run(prepared, threading.Event())


# -- the working folder -----------------------------------------------------------------------


def test_paths_resolve_inside_and_escapes_are_outside(root: Path, tmp_path: Path) -> None:
    ws = Workspace(root)
    outside = Path(os.path.realpath(write(tmp_path, "elsewhere/notes.txt", "x")))
    (root / "link_out").symlink_to(outside.parent)
    (root / "link_in").symlink_to(root / "src")
    assert (ws.resolve("src/app.py").inside, ws.resolve("src/app.py").shown) == (True, "src/app.py")
    assert ws.resolve(str(root / "README.md")).shown == "README.md"
    assert ws.resolve(".").shown == "."
    dotdot = ws.resolve("src/../../elsewhere/notes.txt")
    assert (dotdot.inside, dotdot.shown) == (False, str(outside))
    escaped = ws.resolve("link_out/notes.txt")
    assert (escaped.inside, escaped.path) == (False, outside)
    assert not ws.resolve("link_out/new_file.txt").inside  # not there yet, still outside
    via_link = ws.resolve("link_in/app.py")
    assert (via_link.inside, via_link.shown) == (True, "src/app.py")
    assert not ws.resolve("/etc/hostname").inside


def test_offered_tools_follow_the_setting_and_an_unknown_name_is_one_clear_line(root: Path) -> None:
    assert [s.name for s in box(root).specs] == [
        "read_file",
        "list_files",
        "search",
        "edit_file",
        "write_file",
        "run_command",
    ]
    assert [s.name for s in box(root, offered="read-only").specs] == ["read_file", "list_files", "search"]
    assert [s.name for s in box(root, offered="run_command, read_file").specs] == ["read_file", "run_command"]
    with pytest.raises(ValueError) as raised:
        box(root, offered="read_file,delete_everything")
    message = str(raised.value)
    assert "\n" not in message and "tools.offered" in message and "delete_everything" in message
    assert "run_command" in message
    for spec in box(root).specs:
        schema = spec.template_dict()["function"]["parameters"]
        assert schema["type"] == "object" and set(schema["required"]) <= set(schema["properties"])
        assert len(spec.description) > 40


@pytest.mark.parametrize(
    ("tool_call", "expected"),
    [
        (call("delete_file", path="a"), "there is no tool 'delete_file'"),
        (call("read_file"), "`path` is required"),
        (call("read_file", path="README.md", colour="red"), "unknown argument colour"),
        (call("read_file", path="README.md", start_line="10"), "`start_line` must be an integer"),
        (call("read_file", path="README.md", start_line=True), "`start_line` must be an integer"),
        (call("read_file", path="README.md", start_line=0), "start_line is 1-based"),
        (
            call("read_file", path="README.md", start_line=5, end_line=2),
            "end_line (2) is before start_line (5)",
        ),
        (call("read_file", path=""), "the path is empty"),
        (call("run_command", command="ls", timeout_s=-1), "timeout_s must be more than 0"),
        (call("search", pattern="x", glob=3), "`glob` must be a string"),
        (ToolCall("read_file", {}, error="the call's JSON did not parse"), "the call's JSON did not parse"),
    ],
)
def test_model_mistakes_become_an_error_and_nothing_runs(
    root: Path, tool_call: ToolCall, expected: str
) -> None:
    prepared, outcome = run(box(root), tool_call)
    assert expected in prepared.error
    assert (outcome.ok, outcome.content) == (False, prepared.error)


def test_a_tool_not_offered_is_refused_by_name(root: Path) -> None:
    prepared = box(root, offered="read-only").prepare(call("run_command", command="rm -rf ."))
    assert (
        "run_command is not offered" in prepared.error and "read_file, list_files, search" in prepared.error
    )


def test_null_optional_arguments_count_as_absent(root: Path) -> None:
    prepared = box(root).prepare(call("read_file", path="README.md", start_line=None, end_line=2.0))
    assert prepared.error == "" and dict(prepared.arguments) == {
        "path": "README.md",
        "start_line": 1,
        "end_line": 2,
    }


# -- read_file --------------------------------------------------------------------------------


def test_read_file_returns_the_text_with_its_range_first(root: Path) -> None:
    prepared, outcome = run(box(root), call("read_file", path="src/app.py"))
    assert (prepared.kind, prepared.summary, prepared.outside) == ("read", "read_file src/app.py", False)
    assert outcome.ok and not outcome.truncated
    assert outcome.content == "src/app.py: lines 1-4 of 4\nimport os\n\ndef main():\n    return os.getcwd()\n"
    _, part = run(box(root), call("read_file", path="src/app.py", start_line=3, end_line=9))
    assert part.content == "src/app.py: lines 3-4 of 4\ndef main():\n    return os.getcwd()\n"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"path": "missing.py"}, "read_file: missing.py: no such file"),
        ({"path": "src"}, "read_file: src is a folder, not a file: use list_files"),
        ({"path": "README.md", "start_line": 9}, "README.md has 2 lines: start_line 9 is past the end"),
        ({"path": "image.png"}, "read_file: image.png is a binary file (8 bytes): not shown"),
        ({"path": "pipe"}, "read_file: pipe is not a regular file"),
    ],
)
def test_read_file_errors_are_outcomes(root: Path, arguments: dict, expected: str) -> None:
    (root / "image.png").write_bytes(b"\x89PNG\0\0\0\0")
    os.mkfifo(root / "pipe")
    prepared, outcome = run(box(root), call("read_file", **arguments))
    assert prepared.error == ""
    assert not outcome.ok and expected in outcome.content


def test_a_long_file_is_cut_and_says_where_to_read_on(root: Path) -> None:
    write(root, "big.txt", "".join(f"line {n:04d}\n" for n in range(1, 1001)))  # 10 bytes a line
    tools = box(root, max_output_kib=1)
    _, outcome = run(tools, call("read_file", path="big.txt"))
    assert outcome.truncated and outcome.content.startswith("big.txt: lines 1-102 of 1000\nline 0001\n")
    assert outcome.content.endswith("line 0102\n... cut: 898 more lines; read on with start_line=103")
    _, more = run(tools, call("read_file", path="big.txt", start_line=103, end_line=110))
    assert more.content.splitlines()[:2] == ["big.txt: lines 103-110 of 1000", "line 0103"]
    write(root, "minified.js", "x" * 5000 + "\nsecond\n")
    _, long_line = run(tools, call("read_file", path="minified.js"))
    assert long_line.truncated and long_line.content.count("x") == 1024
    assert "line 1 is longer than 1 KiB" in long_line.content and "start_line=2" in long_line.content


def test_reading_outside_is_marked_and_reads_once_allowed(root: Path, tmp_path: Path) -> None:
    notes = write(tmp_path, "notes.txt", "outside text\n")
    prepared, outcome = run(box(root), call("read_file", path="../notes.txt"))
    assert prepared.outside and prepared.summary == f"read_file {notes}"
    assert outcome.content == f"{notes}: lines 1-1 of 1\noutside text\n"


# -- list_files and search --------------------------------------------------------------------


def test_list_files_walks_without_hidden_or_clutter_folders(root: Path) -> None:
    _, outcome = run(box(root), call("list_files"))
    assert outcome.content.splitlines() == [
        "3 files under . match '**/*'",
        "README.md",
        "src/app.py",
        "src/util/helpers.py",
    ]
    _, py = run(box(root), call("list_files", pattern="*.py", path="src"))
    assert py.content.splitlines()[1:] == ["src/app.py", "src/util/helpers.py"]
    _, deep = run(box(root), call("list_files", pattern="util/**/*.py", path="src/"))
    assert deep.content.splitlines()[1:] == ["src/util/helpers.py"]
    _, missing = run(box(root), call("list_files", path="nowhere"))
    assert not missing.ok and "nowhere: no such folder" in missing.content


@needs_git
def test_list_files_in_a_git_tree_leaves_out_ignored_files(root: Path) -> None:
    subprocess.run(["git", "-C", str(root), "init", "-q"], check=True)
    write(root, ".gitignore", "build/\n*.log\n")
    write(root, "build/out.py", "")
    write(root, "debug.log", "")
    _, outcome = run(box(root), call("list_files", pattern="**/*"))
    assert outcome.content.splitlines()[1:] == [
        ".gitignore",
        ".hidden/secret.txt",
        "README.md",
        "node_modules/pkg/index.js",  # git decides here, and nothing ignores it
        "src/app.py",
        "src/util/helpers.py",
    ]


def test_a_long_listing_is_cut_and_counted(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(find_tools, "MAX_SHOWN_FILES", 2)
    _, outcome = run(box(root), call("list_files"))
    assert outcome.truncated and outcome.content.endswith(
        "src/app.py\n... cut: 1 more file; narrow the pattern or the path"
    )


def test_globs() -> None:
    assert glob_matcher("**/*")("a") and glob_matcher("**/*")("a/b/c")
    matches = glob_matcher("src/**/*.py")
    assert matches("src/x.py") and matches("src/a/b.py") and not matches("lib/src/x.py")
    assert glob_matcher("*.{py,md}")("docs/x.md") and not glob_matcher("*.{py,md}")("x.txt")
    assert glob_matcher("test_[!x]*.py")("tests/test_a.py") and not glob_matcher("test_[!x]*.py")("test_x.py")
    assert not glob_matcher("src/*.py")("src/a/b.py")


SEARCH_TREE = {
    "b.txt": "main here\nnothing\nmain again\n",
    "a/z.py": "def main():\n    pass\n",
    "a/crlf.txt": "main with crlf\r\nother\r\n",
    "blob.bin": "main\0binary\n",
    "notes.md": "Main capitalised\n",
}


def search_text(root: Path, **arguments: object) -> str:
    for rel, text in SEARCH_TREE.items():
        write(root, rel, text)
    _, outcome = run(box(root), call("search", **arguments))
    return outcome.content


def no_rg(monkeypatch: pytest.MonkeyPatch) -> None:
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "rg" else which(name, *a, **k))


def python_search_fails(*args: object) -> None:
    raise AssertionError("the Python search ran though ripgrep could")


EXPECTED_MAIN = [
    "7 matches in 6 files",
    "README.md:2: run main",
    "a/crlf.txt:1: main with crlf",
    "a/z.py:1: def main():",
    "b.txt:1: main here",
    "b.txt:3: main again",
    "src/app.py:3: def main():",
    "src/util/helpers.py:2:     return 'main'",
]


@needs_rg
def test_search_with_ripgrep(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(find_tools, "_search_python", python_search_fails)
    assert search_text(root, pattern=r"\bmain\b", glob="*.{md,txt,py}").splitlines() == EXPECTED_MAIN


def test_search_without_ripgrep_gives_the_same_answer(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_rg(monkeypatch)
    assert search_text(root, pattern=r"\bmain\b", glob="*.{md,txt,py}").splitlines() == EXPECTED_MAIN


@pytest.mark.parametrize("ripgrep", [pytest.param(True, marks=needs_rg), False])
def test_search_details(root: Path, monkeypatch: pytest.MonkeyPatch, ripgrep: bool) -> None:
    if not ripgrep:
        no_rg(monkeypatch)
    assert search_text(root, pattern=r"(?<=def )main").splitlines() == [  # not ripgrep's syntax
        "2 matches in 2 files",
        "a/z.py:1: def main():",
        "src/app.py:3: def main():",
    ]
    assert search_text(root, pattern="binary") == "no matches for 'binary' in 8 files"
    assert search_text(root, pattern="crlf$") == "1 match in 1 file\na/crlf.txt:1: main with crlf"
    assert (
        search_text(root, pattern="(?i)^main c", path="notes.md")
        == "1 match in 1 file\nnotes.md:1: Main capitalised"
    )
    assert search_text(root, pattern="zebra", path="a") == "no matches for 'zebra' in 2 files"
    bad = search_text(root, pattern="main(")
    assert bad.startswith("search: bad regular expression 'main(': missing ), unterminated subpattern")
    monkeypatch.setattr(find_tools, "MAX_MATCHES", 3)
    assert search_text(root, pattern="main").splitlines() == [
        "first 3 matches in 3 files",
        "README.md:2: run main",
        "a/crlf.txt:1: main with crlf",
        "a/z.py:1: def main():",
        "... cut: there are more matches; narrow the pattern, the path or the glob",
    ]


# -- edit_file and write_file -----------------------------------------------------------------


def test_edit_file_shows_its_diff_then_changes_the_file_keeping_its_mode(root: Path) -> None:
    target = root / "src/app.py"
    target.chmod(0o754)
    tools = box(root)
    prepared = tools.prepare(call("edit_file", path="src/app.py", old="os.getcwd()", new="'.'"))
    assert (prepared.kind, prepared.summary, prepared.paths) == (
        "edit",
        "edit_file src/app.py (+1 -1)",
        (str(target),),
    )
    assert prepared.diff.splitlines()[:2] == ["--- a/src/app.py", "+++ b/src/app.py"]
    assert "-    return os.getcwd()\n+    return '.'\n" in prepared.diff
    assert "getcwd" in target.read_text()  # nothing written before it runs
    outcome = tools.run(prepared, threading.Event())
    assert (outcome.ok, outcome.content) == (True, "edited src/app.py (+1 -1)")
    assert target.read_text() == "import os\n\ndef main():\n    return '.'\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o754


@pytest.mark.parametrize(
    ("old", "expected"),
    [
        (
            "return os.getcwd() ",
            "`old` was not found in src/app.py; it matches at line 4 without its leading",
        ),
        ("def main():\n  return", "its first line appears at line 3 but the rest differs"),
        ("zebra", "`old` was not found in src/app.py; read the file again and copy the exact text"),
        ("os", "`old` matches 2 times in src/app.py (lines 1, 4): include more of the surrounding text"),
        ("", "`old` is empty"),
        ("import os", "`old` and `new` are the same"),
    ],
)
def test_edit_file_must_match_exactly_once(root: Path, old: str, expected: str) -> None:
    prepared = box(root).prepare(call("edit_file", path="src/app.py", old=old, new="import os"))
    assert expected in prepared.error


def test_edit_file_keeps_crlf_and_goes_through_a_symlink(root: Path) -> None:
    target = root / "win.txt"
    target.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    (root / "link.txt").symlink_to(target)
    tools = box(root)
    prepared = tools.prepare(call("edit_file", path="link.txt", old="two\nthree", new="2\n3"))
    assert prepared.paths == (str(target),) and prepared.summary == "edit_file win.txt (+2 -2)"
    assert tools.run(prepared, threading.Event()).ok
    assert target.read_bytes() == b"one\r\n2\r\n3\r\n"
    assert (root / "link.txt").is_symlink()


def test_an_edit_refuses_a_file_changed_since_it_was_prepared(root: Path) -> None:
    tools = box(root)
    prepared = tools.prepare(call("edit_file", path="README.md", old="run main", new="run it"))
    (root / "README.md").write_text("# Project\nrun main\nmore\n")
    outcome = tools.run(prepared, threading.Event())
    assert not outcome.ok and "README.md changed since this edit was prepared" in outcome.content
    assert (root / "README.md").read_text() == "# Project\nrun main\nmore\n"


def test_edit_file_refuses_binary_and_non_utf8_files(root: Path) -> None:
    (root / "latin1.txt").write_bytes(b"caf\xe9\n")
    (root / "blob.bin").write_bytes(b"a\0b")
    tools = box(root)
    assert (
        "not UTF-8 text (byte 3)"
        in tools.prepare(call("edit_file", path="latin1.txt", old="caf", new="x")).error
    )
    assert "binary file" in tools.prepare(call("edit_file", path="blob.bin", old="a", new="x")).error


def test_write_file_creates_folders_and_overwrites_keeping_the_mode(root: Path) -> None:
    tools = box(root)
    prepared = tools.prepare(call("write_file", path="new/deep/file.txt", content="a\nb\n"))
    assert prepared.summary == "write_file new/deep/file.txt (new file, 2 lines)"
    assert prepared.diff.splitlines()[:3] == ["--- /dev/null", "+++ b/new/deep/file.txt", "@@ -0,0 +1,2 @@"]
    assert prepared.paths == (str(root / "new/deep/file.txt"),)
    outcome = tools.run(prepared, threading.Event())
    assert outcome.content == "created new/deep/file.txt (2 lines, 4 bytes)"
    assert (root / "new/deep/file.txt").read_text() == "a\nb\n"
    script = write(root, "run.sh", "echo old")
    script.chmod(0o755)
    prepared = tools.prepare(call("write_file", path="run.sh", content="echo new"))
    assert "-echo old\n\\ No newline at end of file\n+echo new\n" in prepared.diff
    assert tools.run(prepared, threading.Event()).content == "overwrote run.sh (1 line, 8 bytes)"
    assert script.read_text() == "echo new" and stat.S_IMODE(script.stat().st_mode) == 0o755
    assert (
        "README.md is a file, not a folder"
        in tools.prepare(call("write_file", path="README.md/x", content="")).error
    )


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = box(root)
    prepared = tools.prepare(call("write_file", path="README.md", content="new text\n"))

    def disk_full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    outcome = tools.run(prepared, threading.Event())
    monkeypatch.undo()
    assert not outcome.ok and outcome.content == "write_file: No space left on device"
    assert (root / "README.md").read_text() == "# Project\nrun main\n"
    assert sorted(p.name for p in root.iterdir()) == [".hidden", "README.md", "node_modules", "src"]


def test_writing_outside_is_marked(root: Path, tmp_path: Path) -> None:
    prepared = box(root).prepare(call("write_file", path=str(tmp_path / "x.txt"), content="x"))
    assert prepared.outside and prepared.paths == (str(tmp_path / "x.txt"),)
    assert prepared.diff.splitlines()[1] == f"+++ {tmp_path / 'x.txt'}"


def test_nothing_starts_once_stopped(root: Path) -> None:
    tools = box(root)
    stop = threading.Event()
    stop.set()
    outcome = tools.run(tools.prepare(call("write_file", path="x.txt", content="x")), stop)
    assert (
        not outcome.ok
        and outcome.content == "write_file: stopped by the user"
        and not (root / "x.txt").exists()
    )
