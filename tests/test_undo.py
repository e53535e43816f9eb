"""Undo without git: real files in tmp_path (not a git repository), a real session database, a
real kill -9 in the middle of a write, and the `velo-chat sessions undo` command in a subprocess."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from velo_chat.app.errors import UserError
from velo_chat.app.tools.undo import UndoFailed, edits_after, record_change, undo
from velo_chat.engine.config import database_path
from velo_chat.store import SessionStore

from tests.support.engine_helpers import run_cli
from tests.support.store_helpers import child_env


class Folder:
    """A working folder and a session whose replies change files in it, as the tool loop does:
    each change is made on disk, then recorded."""

    def __init__(self, store: SessionStore, root: Path) -> None:
        self.store, self.root = store, root
        self.session = store.create_session("coder", working_dir=str(root))
        self.reply = 0

    def turn(self, text: str = "change things") -> int:
        """A new turn; returns the position of its user message."""
        user, reply = self.store.add_exchange(self.session.id, text)
        self.reply = reply.id
        return user.position

    def step(self) -> None:
        """Another reply (a tool step) in the same turn."""
        self.reply = self.store.add_message(self.session.id, "assistant", "").id

    def change(self, name: str, data: bytes | None, index: int = 0) -> Path:
        path = self.root / name
        before = path.read_bytes() if path.exists() else None
        if data is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        record_change(self.store, self.session.id, self.reply, index, path, before, data)
        return path


@pytest.fixture
def folder(db_path: Path, tmp_path: Path) -> Folder:
    root = tmp_path / "project"
    root.mkdir()
    store = SessionStore(db_path)
    yield Folder(store, root)
    store.close()


def test_an_edit_is_put_back_with_its_mode_outside_any_git_repository(folder: Folder) -> None:
    assert not any((p / ".git").exists() for p in (folder.root, *folder.root.parents))
    path = folder.root / "parser.py"
    path.write_bytes(b"def parse():\n    return 1\n")
    path.chmod(0o640)
    folder.turn()
    folder.change("parser.py", b"def parse():\n    return 2\n")
    done = undo(folder.store, folder.session.id)
    assert (done.restored, done.removed, done.conflicts) == ((str(path),), (), ())
    assert path.read_bytes() == b"def parse():\n    return 1\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [
        r.undone_at is not None for r in folder.store.undo_records(folder.session.id, include_undone=True)
    ] == [True]
    assert undo(folder.store, folder.session.id).nothing  # undone edits are not undone twice
    assert sorted(p.name for p in folder.root.iterdir()) == ["parser.py"]  # no temp file left


def test_a_created_file_is_removed_and_a_removed_one_comes_back(folder: Folder) -> None:
    (folder.root / "old.txt").write_bytes(b"keep me\n")
    folder.turn()
    created = folder.change("pkg/new.py", b"print('hi')\n")
    removed = folder.change("old.txt", None, index=1)
    done = undo(folder.store, folder.session.id)
    assert (done.restored, done.removed) == ((str(removed),), (str(created),))
    assert not created.exists() and removed.read_bytes() == b"keep me\n"


def test_several_edits_of_one_file_go_back_to_before_the_first(folder: Folder) -> None:
    (folder.root / "a.py").write_bytes(b"v0\n")
    folder.turn()
    folder.change("a.py", b"v1\n")
    folder.step()
    folder.change("a.py", b"v2\n")
    done = undo(folder.store, folder.session.id)
    assert done.restored == (str(folder.root / "a.py"),)
    assert (folder.root / "a.py").read_bytes() == b"v0\n"


def test_a_file_changed_since_the_edit_is_a_conflict_until_forced(folder: Folder) -> None:
    path = folder.root / "app.py"
    path.write_bytes(b"one\ntwo\n")
    folder.turn()
    folder.change("app.py", b"one\nTWO\n")
    folder.step()
    folder.change("app.py", b"one\nTWO\nthree\n")
    path.write_bytes(b"one\nTWO\nthree\nmine\n")  # the user's change, after the edits
    done = undo(folder.store, folder.session.id)
    assert (done.restored, done.removed) == ((), ())
    [conflict] = done.conflicts  # once for the file, though two edits changed it
    assert conflict.path == str(path)
    assert "(after the edit)" in conflict.diff and "+mine\n" in conflict.diff
    assert path.read_bytes() == b"one\nTWO\nthree\nmine\n"
    assert len(folder.store.undo_records(folder.session.id)) == 2  # neither marked undone
    forced = undo(folder.store, folder.session.id, force=True)
    assert (forced.restored, forced.conflicts) == ((str(path),), ())
    assert path.read_bytes() == b"one\ntwo\n"
    assert folder.store.undo_records(folder.session.id) == []


def test_a_file_already_back_as_before_counts_as_put_back(folder: Folder) -> None:
    path = folder.root / "a.py"
    path.write_bytes(b"before\n")
    folder.turn()
    folder.change("a.py", b"after\n")
    path.write_bytes(b"before\n")  # put back by hand (or by an undo killed before it said so)
    assert undo(folder.store, folder.session.id).restored == (str(path),)
    assert folder.store.undo_records(folder.session.id) == []


def test_undo_walks_back_one_turn_at_a_time_and_turn_n_takes_every_later_turn(folder: Folder) -> None:
    path = folder.root / "log.txt"
    path.write_bytes(b"0")
    first = folder.turn()
    folder.change("log.txt", b"1")
    folder.turn("a question, no edits")
    third = folder.turn()
    folder.change("log.txt", b"3")
    folder.step()
    folder.change("log.txt", b"3b")
    fourth = folder.turn()
    folder.change("log.txt", b"4")
    assert undo(folder.store, folder.session.id).restored == (str(path),)
    assert path.read_bytes() == b"3b"
    assert undo(folder.store, folder.session.id).restored == (str(path),)
    assert path.read_bytes() == b"1"  # the turn without edits is skipped
    assert undo(folder.store, folder.session.id, turn=fourth).nothing  # already undone
    assert undo(folder.store, folder.session.id, turn=first).restored == (str(path),)
    assert path.read_bytes() == b"0"
    assert undo(folder.store, folder.session.id).nothing
    assert (first, third, fourth) == (0, 4, 7)


def test_turn_n_must_name_one_of_the_users_messages(folder: Folder) -> None:
    folder.turn()
    with pytest.raises(UserError, match="message 1 is not yours"):
        undo(folder.store, folder.session.id, turn=1)
    with pytest.raises(UserError, match="message 7 does not exist"):
        undo(folder.store, folder.session.id, turn=7)


def test_a_failed_write_leaves_the_old_file_and_the_record(
    folder: Folder, monkeypatch: pytest.MonkeyPatch
) -> None:
    (folder.root / "a.py").write_bytes(b"a0")
    (folder.root / "b.py").write_bytes(b"b0")
    folder.turn()
    folder.change("a.py", b"a1")
    folder.change("b.py", b"b1", index=1)

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", full_disk)
        with pytest.raises(UndoFailed, match="cannot put back .*b.py: No space left on device"):
            undo(folder.store, folder.session.id)
    assert (folder.root / "b.py").read_bytes() == b"b1"
    assert sorted(p.name for p in folder.root.iterdir()) == ["a.py", "b.py"]  # the temp file went
    assert [r.path for r in folder.store.undo_records(folder.session.id)] == [
        str(folder.root / n) for n in ("a.py", "b.py")
    ]
    assert undo(folder.store, folder.session.id).restored == tuple(
        str(folder.root / n) for n in ("b.py", "a.py")
    )


def test_kill_9_in_the_middle_of_a_write_leaves_the_old_file(folder: Folder, db_path: Path) -> None:
    path = folder.root / "big.txt"
    old, new = b"old line\n" * 50_000, b"new line\n" * 50_000
    path.write_bytes(old)
    folder.turn()
    folder.change("big.txt", new)
    child = textwrap.dedent(
        f"""
        import os, signal
        from velo_chat.app.tools.undo import undo
        from velo_chat.store import SessionStore

        def die(fd):  # the temp file is written, not yet renamed over the file
            os.kill(os.getpid(), signal.SIGKILL)

        os.fsync = die
        with SessionStore({str(db_path)!r}) as store:
            undo(store, {folder.session.id!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], env=child_env(), capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert path.read_bytes() == new  # whole: the file the edit left
    assert len(folder.store.undo_records(folder.session.id)) == 1
    assert undo(folder.store, folder.session.id).restored == (str(path),)
    assert path.read_bytes() == old


def test_edits_after_follows_a_revision_up_its_forks(folder: Folder) -> None:
    folder.turn()
    folder.change("a.py", b"1")
    second = folder.turn()
    folder.change("b.py", b"2")
    third = folder.turn()
    folder.change("c.py", b"3")
    original = folder.session
    assert [Path(r.path).name for r in edits_after(folder.store, original.id, second)] == ["b.py", "c.py"]
    fork = folder.store.fork_before(original.id, third)  # holds turns 0 and 2 of the original
    folder.session = fork
    folder.turn()
    folder.change("d.py", b"4")
    names = [Path(r.path).name for r in edits_after(folder.store, fork.id, second)]
    assert names == ["b.py", "d.py"]  # the original's later turn is not in the fork's history
    assert [Path(r.path).name for r in edits_after(folder.store, fork.id, third)] == ["d.py"]


# -- the command ----------------------------------------------------------------------------------


def test_sessions_undo_on_the_command_line(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "kept.py").write_bytes(b"before\n")
    with SessionStore(database_path()) as store:
        f = Folder(store, root)
        first = f.turn()
        f.change("kept.py", b"after\n")
        f.change("made.py", b"new\n", index=1)
        second = f.turn()
        f.change("kept.py", b"after again\n")
        sid = f.session.id
    (root / "kept.py").write_bytes(b"edited by hand\n")

    conflict = run_cli("sessions", "undo", sid[:8])
    assert conflict.returncode == 2, conflict.stderr
    lines = conflict.stderr.splitlines()
    assert (
        lines[0]
        == f"velo-chat: {root / 'kept.py'} changed since the edit; not restored (--force restores it)"
    )
    assert "-after again" in lines and "+edited by hand" in lines
    assert conflict.stdout == "" and "Traceback" not in conflict.stderr

    forced = run_cli("sessions", "undo", sid, "--force")
    assert (forced.returncode, forced.stdout, forced.stderr) == (0, f"restored {root / 'kept.py'}\n", "")
    assert (root / "kept.py").read_bytes() == b"after\n"

    assert (second, first) == (2, 0)
    earlier = run_cli("sessions", "undo", sid, "--turn", "0")
    assert earlier.returncode == 0, earlier.stderr
    assert earlier.stdout.splitlines() == [f"restored {root / 'kept.py'}", f"removed {root / 'made.py'}"]
    assert (root / "kept.py").read_bytes() == b"before\n" and not (root / "made.py").exists()

    nothing = run_cli("sessions", "undo", sid)
    assert (nothing.returncode, nothing.stdout) == (0, "")
    assert nothing.stderr == f"velo-chat: nothing to undo in session {sid[:8]}\n"

    for args, fragment in ((("zzzz",), "zzzz"), ((sid, "--turn", "1"), "message 1 is not yours")):
        bad = run_cli("sessions", "undo", *args)
        assert bad.returncode == 2 and bad.stdout == ""
        [line] = bad.stderr.splitlines()
        assert line.startswith("velo-chat: error: ") and fragment in line
