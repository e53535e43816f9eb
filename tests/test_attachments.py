"""Reading files for attaching and rendering them for the model (`app/attachments.py`,
`engine/prompt/files.py`), on real files in a temporary folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from velo_chat.app.attachments import (
    AttachmentLimits,
    AttachmentRefused,
    display_path,
    earlier_version,
    expand,
    line_count,
    read_file,
    read_files,
    room_refusal,
)
from velo_chat.engine import render_block, render_user_content
from velo_chat.engine.prompt.files import fence, language
from velo_chat.store import Attachment, SessionStore

LIMITS = AttachmentLimits(max_files=3, max_file_bytes=1000)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "src" / "b.py").write_text("y = 2\n")
    (tmp_path / "README.md").write_text("# Title\n\n```sh\nmake\n```\n")
    return tmp_path


def test_paths_and_globs_expand_in_order_each_file_once(tree):
    found = expand(["README.md", "src/*.py", "src/a.py"], tree, LIMITS)
    assert [display_path(p, tree) for p in found] == ["README.md", "src/a.py", "src/b.py"]


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("missing.py", "no such file"),
        ("src", "is a folder"),
        ("*.rs", "no file matches"),
        ("  ", "empty path"),
    ],
)
def test_what_cannot_be_attached_is_refused_in_one_line(tree, pattern, why):
    with pytest.raises(AttachmentRefused) as refused:
        expand([pattern], tree, LIMITS)
    assert why in str(refused.value) and "\n" not in str(refused.value)


def test_a_glob_over_the_limit_says_how_many(tree):
    for i in range(5):
        (tree / "src" / f"m{i}.py").write_text("")
    with pytest.raises(AttachmentRefused, match=r"matches 7 files; at most 3"):
        expand(["src/*.py"], tree, LIMITS)


def test_binary_and_large_files_are_refused_and_bad_bytes_counted(tree):
    (tree / "blob").write_bytes(b"ab\x00cd")
    with pytest.raises(AttachmentRefused, match="binary"):
        read_file(tree / "blob", tree, LIMITS)
    (tree / "big.txt").write_text("z" * 2000)
    with pytest.raises(AttachmentRefused, match="2,000 bytes"):
        read_file(tree / "big.txt", tree, LIMITS)
    (tree / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    read = read_file(tree / "latin1.txt", tree, LIMITS)
    assert read.replaced == 1 and read.attachment.content == "caf\ufffd\n"
    data = (tree / "latin1.txt").read_bytes()
    assert read.attachment.sha256 == hashlib.sha256(data).hexdigest() and read.attachment.size == len(data)


def test_a_file_outside_the_folder_is_named_by_its_absolute_path(tree, tmp_path_factory):
    other = tmp_path_factory.mktemp("other") / "c.py"
    other.write_text("z = 3\n")
    (attachment,) = [r.attachment for r in read_files([str(other)], tree, LIMITS)]
    assert attachment.path == other.as_posix()


def test_the_block_is_a_pure_function_of_path_and_text(tree):
    readme = read_file(tree / "README.md", tree, LIMITS).attachment
    block = render_block(readme)
    # a Markdown file with a fence of its own gets a longer fence, so it cannot end the block
    assert block == "README.md\n````markdown\n# Title\n\n```sh\nmake\n```\n````"
    assert render_block(readme) == block
    content = render_user_content([readme], "Fix the title")
    assert content == block + "\n\nFix the title"
    assert render_user_content([], "plain") == "plain"
    no_newline = Attachment("x.py", "0" * 64, 5, "a = 1")
    assert render_block(no_newline) == "x.py\n```python\na = 1\n```"


def test_languages_and_fences():
    assert language("src/app.py") == "python" and language("Makefile") == "makefile"
    assert language("notes.unknown") == "" and language("LICENSE") == ""
    assert fence("no ticks") == "```" and fence("a ```` b") == "`````"
    assert line_count("a\nb\n") == 2 and line_count("a\nb") == 2 and line_count("") == 0


def test_the_chip_says_whether_the_session_holds_the_file_already(tmp_path):
    with SessionStore(tmp_path / "s.db") as store:
        session = store.create_session("default")
        old = Attachment("app.py", "1" * 64, 3, "old")
        store.add_exchange(session.id, "first", attachments=[old])
        store.add_exchange(session.id, "second")
        history = store.messages(session.id)
    assert earlier_version("app.py", "1" * 64, history) == "unchanged since turn 1"
    assert earlier_version("app.py", "2" * 64, history).startswith("changed since turn 1")
    assert earlier_version("other.py", "1" * 64, history) == ""


def test_the_room_refusal_gives_both_counts():
    assert room_refusal(100, 500, 1000) is None
    refusal = room_refusal(600, 500, 1000)
    assert refusal is not None and "600 tokens" in refusal and "room for 499" in refusal
