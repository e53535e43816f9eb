"""Files attached to a user message: which files a request names, reading them (or refusing
them in one line), what a chip says about a file the session held before, and whether the files
fit the context.

How the model sees them is the engine's (`velo_chat.engine.render_user_content`: each file as a
fenced block labelled with its path, before the typed text). The store keeps them apart from the
typed text (`store.Attachment`: path, sha256 and size of the file's bytes, and the text as sent),
so the transcript can show them folded and an export carries them whole. A file read here is the
file as it was when attached: a later change on disk is a new version, attached again to a new
message, never a change to the old one. Nothing here imports Textual: the TUI and
`velo-chat ask` share it.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from velo_chat.engine.config import AttachmentSettings
from velo_chat.store import Attachment, Message
from velo_chat.store.input_text import BinaryInput, decode_text

from .errors import UserError


class AttachmentRefused(UserError):
    """A file that cannot be attached; the message is one line naming it and why."""


@dataclass(frozen=True)
class AttachmentLimits:
    """What one message may attach (the profile's `[attachments]` section)."""

    max_files: int = 50
    max_file_bytes: int = 4096 * 1024

    @classmethod
    def from_settings(cls, settings: AttachmentSettings) -> AttachmentLimits:
        return cls(settings.max_files, settings.max_file_kib * 1024)


@dataclass(frozen=True)
class ReadFile:
    """A file read for attaching, and how many of its bytes were not UTF-8 (shown as U+FFFD)."""

    attachment: Attachment
    replaced: int = 0


# -- which files ---------------------------------------------------------------------------------


def has_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def expand(patterns: Sequence[str], base: Path, limits: AttachmentLimits) -> list[Path]:
    """The files `patterns` name, relative to `base` (globs allowed, `**` recursive), in the
    order given (a glob's matches sorted), each once.

    Refuses in one line: a path that does not exist, a folder, a glob that matches no file, and
    more files than `limits.max_files` (saying how many)."""
    found: list[Path] = []
    for pattern in patterns:
        raw = os.path.expanduser(pattern.strip())
        if not raw:
            raise AttachmentRefused("an empty path cannot be attached")
        if has_glob(raw):
            matches = sorted(glob.glob(raw, root_dir=base, recursive=True))
            files = [_absolute(m, base) for m in matches if _absolute(m, base).is_file()]
            if not files:
                raise AttachmentRefused(f"{pattern}: no file matches")
            found.extend(files)
        else:
            path = _absolute(raw, base)
            if path.is_dir():
                raise AttachmentRefused(
                    f"{pattern} is a folder; attach its files with a glob such as {pattern.rstrip('/')}/*.py"
                )
            if not path.exists():
                raise AttachmentRefused(f"{pattern}: no such file")
            found.append(path)
        unique = _unique(found)
        if len(unique) > limits.max_files:
            raise AttachmentRefused(
                f"{' '.join(patterns)} matches {len(unique):,} files; at most {limits.max_files:,} "
                "may be attached at once (attachments.max_files in the profile)"
            )
    return _unique(found)


def _unique(paths: Iterable[Path]) -> list[Path]:
    """Each file once (two names of one file, through `..` or a link, count once), first wins."""
    seen: dict[Path, Path] = {}
    for path in paths:
        seen.setdefault(path.resolve(), Path(os.path.abspath(path)))
    return list(seen.values())


def _absolute(path: str, base: Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else base / p


def display_path(path: Path, base: Path) -> str:
    """How the model and the transcript name the file: relative to `base` (the session's
    working folder) when inside it, else absolute; always with `/`."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(os.path.abspath(base)).as_posix()
    except ValueError:
        return absolute.as_posix()


# -- reading --------------------------------------------------------------------------------------


def read_file(path: Path, base: Path, limits: AttachmentLimits) -> ReadFile:
    """Read one file for attaching. Refuses (one line): unreadable, larger than the limit,
    binary (NUL bytes). Bytes that are not UTF-8 become U+FFFD (`ReadFile.replaced` says how
    many), by the same rules as typed input (`store.input_text`)."""
    shown = display_path(path, base)
    try:
        size = path.stat().st_size
        if size > limits.max_file_bytes:
            raise AttachmentRefused(
                f"{shown} is {size:,} bytes; files over {limits.max_file_bytes // 1024:,} KiB are not "
                "attached (attachments.max_file_kib in the profile)"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise AttachmentRefused(f"{shown}: cannot read it ({exc.strerror or exc})") from None
    try:
        clean = decode_text(data, shown)
    except BinaryInput:
        raise AttachmentRefused(
            f"{shown} is a binary file (it holds NUL bytes); only text can be attached"
        ) from None
    attachment = Attachment(
        path=shown, sha256=hashlib.sha256(data).hexdigest(), size=len(data), content=clean.text
    )
    return ReadFile(attachment, clean.replaced)


def read_files(patterns: Sequence[str], base: Path, limits: AttachmentLimits) -> list[ReadFile]:
    """`expand` then `read_file` each: all the files, or the first refusal."""
    return [read_file(path, base, limits) for path in expand(patterns, base, limits)]


# -- what the model sees (`velo_chat.engine.render_user_content`) ----------------------------------


def line_count(content: str) -> int:
    return content.count("\n") + (0 if content.endswith("\n") or not content else 1)


# -- the session's earlier versions ---------------------------------------------------------------


def earlier_version(path: str, sha256: str, history: Iterable[Message]) -> str:
    """What the chip says when the same path was attached earlier in the session: the turn
    (1-based among the user's messages) that holds the last version, and whether it differs.
    "" when it was not attached before."""
    turn = 0
    last: tuple[int, str] | None = None
    for message in history:
        if message.role != "user":
            continue
        turn += 1
        for a in message.attachments:
            if a.path == path:
                last = (turn, a.sha256)
    if last is None:
        return ""
    if last[1] == sha256:
        return f"unchanged since turn {last[0]}"
    return f"changed since turn {last[0]} (that turn keeps the old version)"


def room_refusal(files_tokens: int, prompt_tokens: int, n_ctx: int) -> str | None:
    """The one-line refusal when the files do not fit the context's room, or None. `prompt_tokens`
    is the conversation with the typed text but without the files."""
    room = max(0, n_ctx - prompt_tokens - 1)
    if files_tokens <= room:
        return None
    return (
        f"the attached files are {files_tokens:,} tokens but the context has room for {room:,} more "
        f"({prompt_tokens:,} of {n_ctx:,} already used); attach fewer or smaller files, start a "
        "new session, or raise context.n_ctx in the profile"
    )
