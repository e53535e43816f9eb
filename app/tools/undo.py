"""Undo without git: put back the files a session's tool calls changed.

The tool loop records every file an edit, a write or a removal changed (`record_change`): its
bytes before and after, stored once by sha256 in the session database, so undo works in any
folder, a git repository or not, and survives a restart. No UI here: the CLI (`velo-chat
sessions undo`) and the TUI call `undo`, and a revision asks `edits_after` what it could undo.

What undo does (docs/coding-sessions.md, "Undo"):

- A **turn** is named by the position of its user message, as `velo-chat sessions show ID`
  numbers the messages and `ask --edit N` takes them; it holds the replies (the tool steps)
  up to the next user message. `undo(turn=None)` reverts the edits of the last turn that made
  any not yet undone, so undoing again walks back one turn at a time; `undo(turn=N)` reverts
  every edit not yet undone made in turn N and later.
- Edits are reverted newest first, each to the bytes its file had before it: a file the call
  created is removed, one it removed is put back.
- A file whose bytes now differ from what the edit left (changed since, by hand or by a later
  turn of another session) is not touched: it is a `Conflict`, with a unified diff of the edit's
  bytes against the file now, and the older edits of that file are left too (putting them back
  would silently drop the change made since). `force` puts it back anyway.
- A file already as it was before the edit (put back by hand, or by an undo that was killed
  before it could say so) counts as put back.
- Each write is atomic (a temp file in the same folder, fsynced, renamed over the file, the
  folder fsynced): a kill -9 leaves the old file or the new one, never half of one. The file
  keeps its mode; a file put back where none is gets the mode a new file gets (the umask).
  A symlink stays a link: its target is written.
- An edit is marked undone only once its file was actually put back, so one left as a
  conflict, or not reached because a write failed, is undone by the next undo.

The caller holds the session's writer lock (`SessionStore.writer`): a turn running meanwhile
would be changing the same files.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from velo_chat.store import Message, MessageNotFound, SessionNotFound, SessionStore, UndoRecord

from ..errors import UserError
from .file_tools import write_atomically


@dataclass(frozen=True)
class Conflict:
    """A file changed since the edit, left as it is."""

    path: str
    diff: str
    """A unified diff of the bytes the edit left against the file now."""


@dataclass(frozen=True)
class UndoOutcome:
    """What an undo did: each path once, as it ends (put back with bytes, or removed)."""

    restored: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    conflicts: tuple[Conflict, ...] = ()

    @property
    def nothing(self) -> bool:
        """There was nothing to undo."""
        return not (self.restored or self.removed or self.conflicts)


class UndoFailed(UserError):
    """A file could not be put back (permissions, a full disk). The files before it were, and
    are marked undone; it and the older edits are not."""


def record_change(
    store: SessionStore,
    session_id: str,
    message_id: int,
    call_index: int,
    path: Path,
    before: bytes | None,
    after: bytes | None,
) -> UndoRecord:
    """Record that call `call_index` of reply `message_id` changed `path` from `before` to
    `after` (None: the file did not exist). The path is stored absolute."""
    return store.add_undo_record(session_id, message_id, call_index, os.path.abspath(path), before, after)


def undo(
    store: SessionStore, session_id: str, *, turn: int | None = None, force: bool = False
) -> UndoOutcome:
    """Revert the edits of the last turn that made any (`turn` None), or of turn `turn` and later
    (the position of one of the session's user messages, else `UserError`)."""
    messages = store.messages(session_id)
    if turn is None:
        pending = store.undo_records(session_id)
        if not pending:
            return UndoOutcome()
        positions = {m.id: m.position for m in messages}
        start = turn_start(messages, positions[pending[-1].message_id])
    else:
        role = next((m.role for m in messages if m.position == turn), None)
        if role != "user":
            what = "is not yours" if role else "does not exist"
            raise UserError(
                f"message {turn} {what}: a turn is named by the position of your message that "
                "started it, as 'velo-chat sessions show ID' numbers them"
            )
        start = turn
    return revert(store, store.undo_records(session_id, since_position=start), force=force)


def turn_start(messages: Sequence[Message], position: int) -> int:
    """The position of the user message that started the turn holding `position` (0 when no
    user message comes before it)."""
    return max((m.position for m in messages if m.role == "user" and m.position <= position), default=0)


def edits_after(store: SessionStore, session_id: str, position: int) -> list[UndoRecord]:
    """The edits not yet undone that a revision of the session before `position` leaves on disk:
    those its replies at `position` or later made, and, when the session is a fork whose copied
    messages reach `position`, those the forked session's replies made there (and so on up its
    forks), in the order they were made. `revert` undoes them."""
    found = store.undo_records(session_id, since_position=position)
    session = store.get_session(session_id)
    end: int | None = None  # the copied messages are the parent's at positions < end
    while session.parent_session_id and not session.continues and session.forked_from_message_id is not None:
        try:
            parent = store.get_session(session.parent_session_id)
            at = store.get_message(session.forked_from_message_id)
        except (SessionNotFound, MessageNotFound):  # deleted since: its edits went with it
            break
        end = at.position + 1 if end is None else min(end, at.position + 1)
        if at.session_id != parent.id or position >= end:
            break
        positions = {m.id: m.position for m in store.messages(parent.id)}
        found += [
            r for r in store.undo_records(parent.id, since_position=position) if positions[r.message_id] < end
        ]
        session = parent
    return sorted(found, key=lambda r: r.id)


def revert(store: SessionStore, records: Iterable[UndoRecord], *, force: bool = False) -> UndoOutcome:
    """Put back the files of `records` (any sessions'), newest first, by the rules above."""
    ends: dict[str, str] = {}  # path -> "restored" | "removed", as it ends
    conflicts: list[Conflict] = []
    blocked: set[str] = set()
    done: list[int] = []
    try:
        for record in sorted(records, key=lambda r: r.id, reverse=True):
            if record.undone_at is not None or record.path in blocked:
                continue
            target = Path(os.path.realpath(record.path))
            before = _version(store, record.before_sha256)
            after = _version(store, record.after_sha256)
            now = _read(target)
            if now != before and now != after and not force:
                conflicts.append(Conflict(record.path, unified_diff(record.path, after, now)))
                blocked.add(record.path)
                continue
            if now != before:
                _put_back(target, before, record.path)
            ends[record.path] = "removed" if before is None else "restored"
            done.append(record.id)
    finally:
        if done:
            store.mark_undone(done)
    return UndoOutcome(
        restored=tuple(p for p, end in ends.items() if end == "restored"),
        removed=tuple(p for p, end in ends.items() if end == "removed"),
        conflicts=tuple(conflicts),
    )


def unified_diff(path: str, recorded: bytes | None, now: bytes | None) -> str:
    """The edit's bytes (`recorded`) against the file now, as a unified diff (None: no file)."""
    if b"\0" in (recorded or b"") or b"\0" in (now or b""):
        return f"Binary file {path} differs from the version the edit left\n"
    old = _lines(recorded)
    new = _lines(now)
    lines = difflib.unified_diff(
        old,
        new,
        fromfile=f"{path} (after the edit)" if recorded is not None else "/dev/null",
        tofile=f"{path} (now)" if now is not None else "/dev/null",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def _lines(data: bytes | None) -> list[str]:
    return [] if data is None else data.decode("utf-8", errors="replace").splitlines(keepends=True)


def _version(store: SessionStore, sha256: str | None) -> bytes | None:
    return None if sha256 is None else store.blob(sha256)


def _read(path: Path) -> bytes | None:
    """The file's bytes now; None when there is no file (a folder or a device is an error)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UndoFailed(f"cannot read {path}: {exc.strerror}") from None


def _put_back(target: Path, data: bytes | None, shown: str) -> None:
    """Remove the file (`data` None) or write it whole: `write_atomically` is the tools' own
    writer (temp file, fsync, rename, folder fsync; the mode kept, a new file the umask's)."""
    try:
        if data is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)  # its folder went with it
            write_atomically(target, data)
    except OSError as exc:
        raise UndoFailed(f"cannot put back {shown}: {exc.strerror or exc}") from None
