"""The files attached to the message being written: the chips above the composer.

`AttachedFiles` is owned by the chat screen. Files come in from the composer's `@` completion
(`Composer.FilesChosen`), from `/read PATH...` typed as a message (`/pin PATH...` attaches them
pinned: a compaction carries pinned files into the continuation, and dropping old turns keeps
them in view; docs/compaction.md), from a revised message (its files come back with its text)
and from a queued message taken back for editing. Each is read at once (`app/attachments.py`),
so a refusal (a missing path, a binary file, a glob matching too many files) is a dialog while
the user is still writing, and the file sent is the file as it was when attached. Re-attaching a
path replaces the pending copy; a path the session already holds in an earlier turn says so on
its chip (unchanged, or changed since), and is sent again as a new version: history is never
rewritten.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from velo_chat.store import Attachment, Message

from ..attachments import AttachmentLimits, AttachmentRefused, earlier_version, line_count, read_files
from ..widgets.composer.chips import AttachmentChips, ChipInfo

READ_COMMAND = "/read"
PIN_COMMAND = "/pin"
PIN_NOTE = "📌 pinned"


def read_command_paths(text: str, command: str = READ_COMMAND) -> list[str] | None:
    """The paths of a `/read PATH...` message (or of `command`, e.g. `/pin`; shell-style
    quoting), or None when `text` is not that command. An empty list: the command with no
    path."""
    stripped = text.strip()
    if stripped != command and not stripped.startswith(command + " "):
        return None
    try:
        return shlex.split(stripped[len(command) :])
    except ValueError as exc:
        raise AttachmentRefused(f"{command}: {exc}") from None


class AttachedFiles:
    """The pending attachments, their chips, and what is known of their tokens."""

    def __init__(
        self,
        *,
        chips: Callable[[], AttachmentChips],
        limits: Callable[[], AttachmentLimits],
        base: Callable[[], Path],
        history: Callable[[], Sequence[Message]],
        changed: Callable[[], None],
    ) -> None:
        """`base`: the folder relative paths start from (the session's working folder);
        `history`: the active session's messages (for the chips' earlier-version notes);
        `changed`: called when the set of files changes (the screen asks for a new preview)."""
        self._chips = chips
        self._limits = limits
        self._base = base
        self._history = history
        self._changed = changed
        self.files: list[Attachment] = []
        self.warnings: list[str] = []  # files whose bytes were not all UTF-8 (said once)
        self._tokens: dict[str, int | None] = {}  # sha256 -> tokens, once a preview counted them

    def attach(self, patterns: Sequence[str], *, pinned: bool = False) -> list[str]:
        """Read and attach the files `patterns` name (all, or none: `AttachmentRefused`),
        `pinned` ones marked so (`Attachment.pinned`). Returns a warning line per file whose
        bytes were not all UTF-8."""
        read = read_files(patterns, self._base(), self._limits())
        if len(self.files) + len(read) > self._limits().max_files:
            raise AttachmentRefused(
                f"{len(self.files) + len(read):,} files would be attached; at most "
                f"{self._limits().max_files:,} at once (attachments.max_files in the profile)"
            )
        for item in read:
            self._put(dataclasses.replace(item.attachment, pinned=True) if pinned else item.attachment)
        self._sync()
        return [
            f"{r.attachment.path}: {r.replaced} bytes were not UTF-8 and became \ufffd"
            for r in read
            if r.replaced
        ]

    def _put(self, attachment: Attachment) -> None:
        for i, pending in enumerate(self.files):
            if pending.path == attachment.path:
                self.files[i] = attachment
                return
        self.files.append(attachment)

    def remove(self, index: int) -> None:
        if 0 <= index < len(self.files):
            del self.files[index]
            self._sync()

    def take(self) -> tuple[Attachment, ...]:
        """The files to send with the message now being sent; the chips empty."""
        files, self.files = tuple(self.files), []
        self._sync()
        return files

    def restore(self, files: Sequence[Attachment]) -> None:
        """Files given back (a refused turn, a message taken back to revise): put in front of
        any attached since, each path once."""
        kept = [f for f in self.files if all(f.path != g.path for g in files)]
        self.files = [*files, *kept]
        self._sync()

    def counted(self, files: Sequence[Attachment], tokens: Sequence[int | None]) -> None:
        """A preview counted the tokens of `files` (the chips show them)."""
        for attachment, n in zip(files, tokens, strict=False):
            self._tokens[attachment.sha256 + attachment.path] = n
        self._show()

    def tokens(self) -> int | None:
        """The pending files' tokens in all, None while one is not counted."""
        counts = [self._tokens.get(a.sha256 + a.path) for a in self.files]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def _sync(self) -> None:
        self._show()
        self._changed()

    def _show(self) -> None:
        history = self._history()
        self._chips().show(
            [
                ChipInfo(
                    a.path,
                    line_count(a.content),
                    self._tokens.get(a.sha256 + a.path),
                    _chip_note(a, history),
                )
                for a in self.files
            ]
        )


def _chip_note(attachment: Attachment, history: Sequence[Message]) -> str:
    """What a chip says beside its counts: pinned (📌), and an earlier version in the session."""
    notes = [PIN_NOTE] if attachment.pinned else []
    earlier = earlier_version(attachment.path, attachment.sha256, history)
    return " · ".join(notes + ([earlier] if earlier else []))
