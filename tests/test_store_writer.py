"""One writer per session: the `flock` on the session's lock file, held by real second processes
and by a second thread. Synchronised on the child's printed line and on events, never on sleeps."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from velo_chat.store import InvalidArgument, SessionBusy, SessionStore
from velo_chat.store.session_lock import LOCKS_DIR

from tests.support.store_helpers import child_env

WAIT_S = 60.0
"""Only a bound on a hung test: every wait below ends on an event long before it."""

_HOLD_WRITER = textwrap.dedent(
    """
    import sys
    from velo_chat.store import SessionStore
    with SessionStore(sys.argv[1]) as store:
        with store.writer(sys.argv[2]):
            print("held", flush=True)
            sys.stdin.read()  # until the parent closes it (or kills this process)
    """
)


@pytest.fixture
def opened(db_path: Path) -> Iterator[tuple[SessionStore, str]]:
    with SessionStore(db_path) as store:
        yield store, store.create_session("fast").id


def hold_in_child(db_path: Path, session_id: str) -> subprocess.Popen[str]:
    """A second process holding the session's writer lock until its stdin closes."""
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD_WRITER, str(db_path), session_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def release_child(child: subprocess.Popen[str]) -> int:
    assert child.stdin is not None
    if not child.stdin.closed:
        child.stdin.close()
    return child.wait(timeout=WAIT_S)


class Waiter(threading.Thread):
    """Runs `store.writer` in a thread, recording what `on_wait` heard and whether it got in."""

    def __init__(self, store: SessionStore, session_id: str, cancel: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.store, self.session_id, self.cancel = store, session_id, cancel
        self.heard: list[str] = []
        self.waiting = threading.Event()
        self.inside = threading.Event()
        self.error: BaseException | None = None

    def on_wait(self, holder: str) -> None:
        self.heard.append(holder)
        self.waiting.set()

    def run(self) -> None:
        try:
            with self.store.writer(self.session_id, on_wait=self.on_wait, cancel=self.cancel, poll_s=0.01):
                self.inside.set()
                self.store.add_message(self.session_id, "user", "written by the waiter")
        except BaseException as exc:  # reported to the test thread
            self.error = exc
            self.waiting.set()


def test_a_second_process_makes_the_writer_wait_until_it_exits(
    opened: tuple[SessionStore, str], db_path: Path
) -> None:
    store, session_id = opened
    child = hold_in_child(db_path, session_id)
    try:
        waiter = Waiter(store, session_id)
        waiter.start()
        assert waiter.waiting.wait(WAIT_S) and waiter.error is None
        assert waiter.heard == [f"process {child.pid}"]
        assert not waiter.inside.is_set()  # the child still holds it (blocked on its stdin)
        assert store.messages(session_id) == []
    finally:
        assert release_child(child) == 0
    waiter.join(WAIT_S)
    assert waiter.inside.is_set() and waiter.error is None
    assert waiter.heard == [f"process {child.pid}"]  # told once, however long it polled
    assert [m.content for m in store.messages(session_id)] == ["written by the waiter"]


def test_a_cancelled_wait_raises_session_busy_and_writes_nothing(
    opened: tuple[SessionStore, str], db_path: Path
) -> None:
    store, session_id = opened
    child = hold_in_child(db_path, session_id)
    try:
        cancel = threading.Event()
        with pytest.raises(SessionBusy, match=f"process {child.pid}") as info:
            with store.writer(session_id, on_wait=lambda holder: cancel.set(), cancel=cancel):
                store.add_message(session_id, "user", "must not be written")
        assert "\n" not in str(info.value)
        assert store.messages(session_id) == []
    finally:
        assert release_child(child) == 0
    with store.writer(session_id, cancel=cancel):  # free now: a set cancel does not matter
        store.add_message(session_id, "user", "after")
    assert [m.content for m in store.messages(session_id)] == ["after"]


def test_a_killed_holder_releases_the_session(opened: tuple[SessionStore, str], db_path: Path) -> None:
    store, session_id = opened
    child = hold_in_child(db_path, session_id)
    os.kill(child.pid, signal.SIGKILL)
    assert release_child(child) == -signal.SIGKILL
    heard: list[str] = []
    with store.writer(session_id, on_wait=heard.append):
        store.add_message(session_id, "user", "after the crash")
    assert heard == []  # the kernel let go of the dead holder's lock: no wait at all
    assert [m.content for m in store.messages(session_id)] == ["after the crash"]


def test_two_threads_of_one_process_exclude_each_other(opened: tuple[SessionStore, str]) -> None:
    store, session_id = opened
    first_inside, let_go = threading.Event(), threading.Event()

    def first() -> None:
        with store.writer(session_id):
            first_inside.set()
            let_go.wait(WAIT_S)
            store.add_message(session_id, "user", "written by the first")

    holder = threading.Thread(target=first, daemon=True)
    holder.start()
    assert first_inside.wait(WAIT_S)
    waiter = Waiter(store, session_id)
    waiter.start()
    try:
        assert waiter.waiting.wait(WAIT_S) and waiter.error is None
        assert waiter.heard == [f"process {os.getpid()} (this one)"]
        assert not waiter.inside.is_set()
    finally:
        let_go.set()
        holder.join(WAIT_S)
        waiter.join(WAIT_S)
    assert waiter.inside.is_set() and waiter.error is None
    assert [m.content for m in store.messages(session_id)] == [
        "written by the first",
        "written by the waiter",
    ]


def test_lock_files_are_private_name_their_holder_and_go_with_the_session(
    opened: tuple[SessionStore, str], db_path: Path
) -> None:
    store, session_id = opened
    folder = db_path.parent / LOCKS_DIR
    lock = folder / f"{session_id}.lock"
    with store.writer(session_id):
        assert lock.read_text() == f"pid {os.getpid()}\n"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert lock.read_text() == ""  # a released lock names nobody
    with store.writer(session_id):  # and is taken again at once
        pass
    store.delete(session_id)
    assert not lock.exists()
    other = store.create_session("fast")
    store.delete(other.id)  # never locked: no lock file, no error


@pytest.mark.parametrize("bad", ["../escape", "", "a/b", "a b"])
def test_a_session_id_that_is_no_file_name_is_refused(opened: tuple[SessionStore, str], bad: str) -> None:
    store, _ = opened
    with pytest.raises(InvalidArgument):
        with store.writer(bad):
            pass
