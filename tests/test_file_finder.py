"""The `@` file list and its ranking (app/file_finder.py) on real folders and real git repos."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from velo_chat.app import file_finder
from velo_chat.app.file_finder import FileFinder

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def write(root: Path, *paths: str) -> None:
    for rel in paths:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{rel}\n")


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def finder_of(tmp_path: Path, *paths: str) -> FileFinder:
    root = tmp_path / "tree"
    write(root, *paths)
    return FileFinder(root)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    write(root, ".gitignore")
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    write(root, "README.md", "src/app/main.py", "src/app/util.py", "docs/guide.md")
    git(root, "add", "-A")
    write(root, "notes.txt", "src/new_module.py")  # untracked, not ignored
    write(root, "debug.log", "build/out.bin", "src/app/trace.log")  # ignored
    return root


@needs_git
def test_a_git_tree_lists_tracked_and_untracked_files_but_not_ignored_ones(repo: Path) -> None:
    assert FileFinder(repo).files() == [
        ".gitignore",
        "README.md",
        "docs/guide.md",
        "notes.txt",
        "src/app/main.py",
        "src/app/util.py",
        "src/new_module.py",
    ]


@needs_git
def test_a_subfolder_of_a_work_tree_lists_relative_to_itself(repo: Path) -> None:
    assert FileFinder(repo / "src").files() == ["app/main.py", "app/util.py", "new_module.py"]


@needs_git
def test_a_tracked_file_deleted_from_disk_is_not_offered(repo: Path) -> None:
    (repo / "docs" / "guide.md").unlink()
    assert "docs/guide.md" not in FileFinder(repo).files()


@needs_git
def test_refresh_lists_again(repo: Path) -> None:
    finder = FileFinder(repo)
    assert "later.md" not in finder.files()
    write(repo, "later.md")
    assert "later.md" not in finder.files()  # listed once
    finder.refresh()
    assert "later.md" in finder.files()


def test_refresh_does_not_wait_for_a_listing_in_flight_and_drops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The UI thread may refresh while a worker lists: it must not block on the listing, and
    a listing begun before the refresh may miss what changed, so it is not kept."""
    started, release = threading.Event(), threading.Event()
    real_list_files = file_finder.list_files

    def slow_list_files(root: Path, max_files: int) -> list[str]:
        started.set()
        release.wait()
        return real_list_files(root, max_files)

    monkeypatch.setattr(file_finder, "list_files", slow_list_files)
    finder = finder_of(tmp_path, "a.py")
    worker = threading.Thread(target=finder.files)
    worker.start()
    safety = threading.Timer(60, release.set)  # a refresh that blocked would still end
    safety.start()
    try:
        assert started.wait(60)
        finder.refresh()
        assert not release.is_set()  # returned while the listing was still held up
    finally:
        release.set()
        safety.cancel()
        worker.join()
    assert not finder.listed
    assert finder.files() == ["a.py"] and finder.listed


def test_a_plain_folder_is_walked_without_dot_dirs_caches_or_symlinked_dirs(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    write(
        root,
        "a.py",
        ".env",
        "pkg/b.py",
        "pkg/__pycache__/b.cpython-311.pyc",
        ".git/config",
        ".venv/lib/site.py",
        "web/node_modules/x/index.js",
        "web/app.js",
    )
    outside = tmp_path / "outside"
    write(outside, "secret.txt")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (root / "alias.py").symlink_to(root / "a.py")
    finder = FileFinder(root)
    assert not finder.listed
    assert finder.files() == [".env", "a.py", "alias.py", "pkg/b.py", "web/app.js"]
    assert finder.listed


def test_a_missing_folder_lists_nothing(tmp_path: Path) -> None:
    finder = FileFinder(tmp_path / "gone")
    assert finder.files() == [] and finder.match("x") == []


def test_the_walk_stops_at_max_files_in_sorted_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "many"
    write(root, *(f"d{d}/f{f}.txt" for d in range(3) for f in range(4)))
    caplog.set_level("INFO", logger="velo_chat.app.file_finder")
    files = FileFinder(root, max_files=5).files()
    assert files == ["d0/f0.txt", "d0/f1.txt", "d0/f2.txt", "d0/f3.txt", "d1/f0.txt"]
    assert "first 5 files" in caplog.text


@needs_git
def test_a_git_list_stops_at_max_files_too(repo: Path) -> None:
    assert FileFinder(repo, max_files=3).files() == [".gitignore", "README.md", "docs/guide.md"]


# -- ranking ----------------------------------------------------------------------------------


def test_a_match_in_the_file_name_ranks_above_one_that_needs_the_directories(tmp_path: Path) -> None:
    finder = finder_of(tmp_path, "conf/notes.md", "src/deep/config.py")
    assert finder.match("conf") == ["src/deep/config.py", "conf/notes.md"]


def test_runs_and_word_starts_rank_above_scattered_letters(tmp_path: Path) -> None:
    finder = finder_of(tmp_path, "format.py", "main.py", "m_o_d.py", "model.py", "almond.py")
    # `ma`: a word start and a run (main) above a run inside a word (format)
    assert finder.match("ma") == ["main.py", "format.py"]
    # `mod`: a run from a word start (model) above three word starts one letter apart (m_o_d),
    # above letters inside a word (almond)
    assert finder.match("mod") == ["model.py", "m_o_d.py", "almond.py"]


def test_a_case_change_starts_a_word(tmp_path: Path) -> None:
    finder = finder_of(tmp_path, "mymodel.py", "MyModel.txt")
    assert finder.match("mm") == ["MyModel.txt", "mymodel.py"]


def test_equal_scores_rank_the_shorter_path_then_the_path_string(tmp_path: Path) -> None:
    finder = finder_of(tmp_path, "lib/b/util.py", "util.py", "lib/a/util.py", "x/util.py")
    assert finder.match("util") == ["util.py", "x/util.py", "lib/a/util.py", "lib/b/util.py"]
    assert finder.match("UTIL", limit=2) == ["util.py", "x/util.py"]  # case-insensitive


def test_a_query_with_a_slash_matches_the_whole_path(tmp_path: Path) -> None:
    finder = finder_of(tmp_path, "src/app/main.py", "src/app/map.py", "src/lib/main.py", "app/main.py")
    assert finder.match("src/app/ma") == ["src/app/map.py", "src/app/main.py"]
    assert finder.match("app/main") == ["app/main.py", "src/app/main.py"]


def test_an_empty_query_gives_the_first_files_and_no_match_gives_none(tmp_path: Path) -> None:
    finder = finder_of(tmp_path, "c.py", "a.py", "b/d.py")
    assert finder.match("", limit=2) == ["a.py", "b/d.py"]
    assert finder.match("zzz") == []


def test_a_longer_query_narrows_and_a_shorter_one_widens_again(tmp_path: Path) -> None:
    finder = finder_of(tmp_path, "alpha.py", "beta.py", "gamma.py")
    assert finder.match("a") == ["alpha.py", "beta.py", "gamma.py"]
    assert finder.match("al") == ["alpha.py"]
    assert finder.match("ma") == ["gamma.py"]
    assert finder.match("a") == ["alpha.py", "beta.py", "gamma.py"]
