"""read_file, edit_file and write_file: a file's text for the model, and changes to it that a
person approves from their diff before anything is written.

An edit is an exact replacement that must match once: a model that copies the text it read
cannot change the wrong place silently, and a miss tells it how to try again. The diff is made
when the call is prepared (the user approves it) and made again just before writing: if the file
changed in between, the write is refused rather than applying a change nobody saw.

Writes are atomic (a temp file beside the target, fsynced, renamed over it: `atomic_write`), keep
the file's permission bits, and go to the real file behind a symlink.
"""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path
from typing import Any

from velo_chat.engine import ToolCall
from velo_chat.engine.config import atomic_write
from velo_chat.engine.config import ToolSettings

from .call_line import diff_counts
from .output import count, decode
from .types import PreparedCall, ToolOutcome
from .workspace import ResolvedPath, Workspace

BINARY_SNIFF_BYTES = 8192
"""A NUL byte in a file's first 8 KiB makes it binary (git's rule of thumb)."""

_DEFAULT_UMASK = 0o022


class ToolError(Exception):
    """A tool cannot do what was asked (no such file, no match): its message is the one line the
    model and the user are shown."""


def target_of(ws: Workspace, prepared: PreparedCall, key: str = "path") -> ResolvedPath:
    """The path argument resolved again at run time. A path that was inside when it was approved
    but now resolves outside (a symlink swapped in between) is refused."""
    target = ws.resolve(str(prepared.arguments[key]))
    if not target.inside and not prepared.outside:
        raise ToolError(f"{target.shown} now resolves outside the working folder; prepare the call again")
    return target


# -- read_file --------------------------------------------------------------------------------


def prepare_read(ws: Workspace, call: ToolCall, args: dict[str, Any]) -> PreparedCall:
    target = ws.resolve(args["path"])
    start = args.setdefault("start_line", 1)
    end = args.get("end_line")
    if start < 1:
        raise ToolError("start_line is 1-based: it must be 1 or more")
    if end is not None and end < start:
        raise ToolError(f"end_line ({end}) is before start_line ({start})")
    span = "" if start == 1 and end is None else f":{start}-{'' if end is None else end}"
    return PreparedCall(
        call, "read", f"read_file {target.shown}{span}", outside=not target.inside, arguments=args
    )


def run_read(ws: Workspace, settings: ToolSettings, prepared: PreparedCall) -> ToolOutcome:
    target = target_of(ws, prepared)
    _require_file(target)
    start: int = prepared.arguments["start_line"]
    end: int | None = prepared.arguments.get("end_line")
    budget = settings.max_output_kib * 1024
    kept: list[bytes] = []
    used = 0
    first_cut = 0  # the first line in range that is not shown (0: none)
    long_line = False  # the first line in range alone is longer than the budget
    total = 0
    with open(target.path, "rb") as fh:
        if b"\0" in fh.read(BINARY_SNIFF_BYTES):
            size = os.fstat(fh.fileno()).st_size
            raise ToolError(f"{target.shown} is a binary file ({size:,} bytes): not shown")
        fh.seek(0)
        for total, raw in enumerate(fh, 1):
            if total < start or (end is not None and total > end) or first_cut or long_line:
                continue
            if used + len(raw) <= budget:
                kept.append(raw)
                used += len(raw)
            elif kept:
                first_cut = total
            else:
                kept.append(raw[:budget])
                long_line = True
    if total == 0:
        return ToolOutcome(
            f"{target.shown}: empty file (0 lines)", details={"path": target.shown, "lines": 0}
        )
    if start > total:
        raise ToolError(f"{target.shown} has {total} lines: start_line {start} is past the end")
    last = min(end, total) if end is not None else total
    kib = settings.max_output_kib
    if long_line:
        shown_to = start
        note = f"... cut: line {start} is longer than {kib} KiB: only its start is shown"
        if last > start:
            note += f"; {count(last - start, 'more line')}, read on with start_line={start + 1}"
    elif first_cut:
        shown_to = first_cut - 1
        note = f"... cut: {count(last - first_cut + 1, 'more line')}; read on with start_line={first_cut}"
    else:
        shown_to, note = last, ""
    text = decode(b"".join(kept))
    if note and not text.endswith("\n"):
        text += "\n"
    header = f"{target.shown}: lines {start}-{shown_to} of {total}"
    details = {"path": target.shown, "lines": total, "start_line": start, "end_line": shown_to}
    return ToolOutcome(f"{header}\n{text}{note}", truncated=bool(note), details=details)


def _require_file(target: ResolvedPath) -> None:
    if target.path.is_dir():
        raise ToolError(f"{target.shown} is a folder, not a file: use list_files")
    if not target.path.exists():
        raise ToolError(f"{target.shown}: no such file")
    if not target.path.is_file():
        raise ToolError(f"{target.shown} is not a regular file (a device, a pipe or a socket)")


# -- edit_file --------------------------------------------------------------------------------


def prepare_edit(ws: Workspace, call: ToolCall, args: dict[str, Any]) -> PreparedCall:
    target = ws.resolve(args["path"])
    before = _read_text(target, "edit_file")
    after = replace_once(before, args["old"], args["new"], target.shown)
    diff = unified_diff(before, after, target)
    return PreparedCall(
        call,
        "edit",
        f"edit_file {target.shown} {_diff_counts(diff)}",
        outside=not target.inside,
        diff=diff,
        paths=(str(target.path),),
        arguments=args,
    )


def run_edit(ws: Workspace, prepared: PreparedCall) -> ToolOutcome:
    target = target_of(ws, prepared)
    before = _read_text(target, "edit_file")
    after = replace_once(before, prepared.arguments["old"], prepared.arguments["new"], target.shown)
    if unified_diff(before, after, target) != prepared.diff:
        raise ToolError(f"{target.shown} changed since this edit was prepared: read it again")
    write_atomically(target.path, after.encode("utf-8"))
    return ToolOutcome(f"edited {target.shown} {_diff_counts(prepared.diff)}", details={"path": target.shown})


def replace_once(text: str, old: str, new: str, shown: str) -> str:
    """`text` with `old` replaced by `new`, which must match exactly once. Line endings follow
    the file: in a file that is all CRLF (or all LF) the model's `\\n` and `\\r\\n` both mean
    the file's own; a file that mixes them is matched exactly as given."""
    if not old:
        raise ToolError("`old` is empty: give the exact text to replace (write_file writes whole files)")
    crlf = "\r\n" in text and "\n" not in text.replace("\r\n", "")
    mixed = not crlf and "\r\n" in text
    work = text.replace("\r\n", "\n") if crlf else text
    if not mixed:
        old, new = old.replace("\r\n", "\n"), new.replace("\r\n", "\n")
    count = work.count(old)
    if count == 0:
        raise ToolError(f"`old` was not found in {shown}; {_miss_hint(work, old)}")
    if count > 1:
        lines = _match_lines(work, old)
        where = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
        raise ToolError(
            f"`old` matches {count} times in {shown} (lines {where}): include more of the "
            "surrounding text so that it matches once"
        )
    if old == new:
        raise ToolError("`old` and `new` are the same: nothing to change")
    result = work.replace(old, new, 1)
    return result.replace("\n", "\r\n") if crlf else result


def _miss_hint(text: str, old: str) -> str:
    stripped = old.strip()
    if stripped and stripped != old and stripped in text:
        at = text.count("\n", 0, text.find(stripped)) + 1
        return (
            f"it matches at line {at} without its leading or trailing whitespace: copy the exact "
            "text, indentation included"
        )
    first = next((ln.strip() for ln in old.split("\n") if ln.strip()), "")
    if first:
        for number, line in enumerate(text.split("\n"), 1):
            if first in line:
                return f"its first line appears at line {number} but the rest differs: read the file again"
    return "read the file again and copy the exact text, whitespace and indentation included"


def _match_lines(text: str, old: str) -> list[int]:
    lines = []
    pos = text.find(old)
    while pos >= 0:
        lines.append(text.count("\n", 0, pos) + 1)
        pos = text.find(old, pos + 1)
    return lines


# -- write_file -------------------------------------------------------------------------------


def prepare_write(ws: Workspace, call: ToolCall, args: dict[str, Any]) -> PreparedCall:
    target = ws.resolve(args["path"])
    if target.path.is_dir():
        raise ToolError(f"{target.shown} is a folder: give a file path")
    _check_parents(target)
    diff = _write_diff(target, args["content"])
    new = not target.path.exists()
    counts = f"(new file, {count(_line_count(args['content']), 'line')})" if new else _diff_counts(diff)
    return PreparedCall(
        call,
        "edit",
        f"write_file {target.shown} {counts}",
        outside=not target.inside,
        diff=diff,
        paths=(str(target.path),),
        arguments=args,
    )


def run_write(ws: Workspace, prepared: PreparedCall) -> ToolOutcome:
    target = target_of(ws, prepared)
    content: str = prepared.arguments["content"]
    if _write_diff(target, content) != prepared.diff:
        raise ToolError(f"{target.shown} changed since this write was prepared: read it again")
    existed = target.path.exists()
    data = content.encode("utf-8")
    target.path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target.path, data)
    verb = "overwrote" if existed else "created"
    return ToolOutcome(
        f"{verb} {target.shown} ({count(_line_count(content), 'line')}, {len(data):,} bytes)",
        details={"path": target.shown, "created": not existed},
    )


def _check_parents(target: ResolvedPath) -> None:
    for parent in target.path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ToolError(f"cannot create {target.shown}: {parent} is a file, not a folder")
            return


def _write_diff(target: ResolvedPath, content: str) -> str:
    if not target.path.exists():
        return unified_diff("", content, target, new_file=True)
    data = target.path.read_bytes()
    before: str | None = None
    if b"\0" not in data[:BINARY_SNIFF_BYTES]:
        try:
            before = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    if before is None:
        old_name, new_name = _diff_names(target)
        return (
            f"--- {old_name}\n+++ {new_name}\n"
            f"binary file ({len(data):,} bytes) replaced by {_line_count(content)} lines of text\n"
        )
    return unified_diff(before, content, target)


# -- shared -----------------------------------------------------------------------------------


def _read_text(target: ResolvedPath, tool: str) -> str:
    _require_file(target)
    data = target.path.read_bytes()
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        raise ToolError(f"{target.shown} is a binary file: {tool} changes text files only")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(
            f"{target.shown} is not UTF-8 text (byte {exc.start:,}): {tool} cannot change it safely"
        ) from None


def unified_diff(before: str, after: str, target: ResolvedPath, *, new_file: bool = False) -> str:
    """The unified diff from `before` to `after`, git-style names, with git's marker for a last
    line that has no newline."""
    old_name, new_name = _diff_names(target)
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        "/dev/null" if new_file else old_name,
        new_name,
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n")
    return "".join(out)


def _diff_names(target: ResolvedPath) -> tuple[str, str]:
    if target.inside:
        return f"a/{target.shown}", f"b/{target.shown}"
    return target.shown, target.shown


def _diff_counts(diff: str) -> str:
    added, removed = diff_counts(diff)
    return f"(+{added} -{removed})"


def _line_count(text: str) -> int:
    return len(text.splitlines())


def write_atomically(path: Path, data: bytes) -> None:
    """Put `data` at `path` atomically, keeping an existing file's permission bits (a new file
    gets the usual 0666 less the umask, as an editor would make it)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()

    def write(fh: Any) -> None:
        fh.write(data)
        os.fchmod(fh.fileno(), mode)

    atomic_write(path, write, sync_dir=True)


def _umask() -> int:
    """The process's umask, read without changing it (`os.umask` sets it, process-wide, which a
    thread running beside this one could observe): Linux says it in /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _DEFAULT_UMASK
