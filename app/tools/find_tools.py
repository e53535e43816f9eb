"""list_files and search: what is in the working folder, and where a pattern occurs.

Both read the same listing as the composer's `@` finder (`file_finder.list_files`): what git
shows in a work tree (tracked plus untracked-but-not-ignored), elsewhere a walk that skips hidden
folders, `__pycache__` and `node_modules`. So the model sees the files the user sees, and which
files a search reads does not depend on whether ripgrep is installed: ripgrep only makes it
faster. It is given that listing's files, in sorted batches, and its answer is dropped for
Python's `re` over the same files when it cannot take the pattern (Python syntax is what the tool
promises: look-arounds and back-references are not in ripgrep's default engine).

Results are sorted (path, then line) and capped: the first matches in that order are kept, so
the same tree gives the same answer whatever ran the search.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from velo_chat.engine import ToolCall
from velo_chat.engine.config import ToolSettings

from ..file_finder import list_files
from .file_tools import ToolError, target_of
from .output import count, decode, shorten
from .types import PreparedCall, ToolOutcome
from .workspace import ResolvedPath, Workspace

MAX_LISTED_FILES = 200_000
"""The most files one listing reads (a home folder must not eat the memory)."""
MAX_SHOWN_FILES = 1000
"""The most paths list_files returns; the rest are counted."""
MAX_MATCHES = 200
"""The most matching lines search returns."""
RG_ARGV_CHARS = 100_000
"""Room for file names on one ripgrep command line (far below the kernel's limit)."""

Hit = tuple[str, int, str]  # (path relative to the searched folder, line number, line text)


# -- list_files -------------------------------------------------------------------------------


def prepare_list(ws: Workspace, call: ToolCall, args: dict[str, Any]) -> PreparedCall:
    args.setdefault("pattern", "**/*")
    args.setdefault("path", ".")
    glob_matcher(args["pattern"])  # a malformed glob is the model's mistake: said now
    target = ws.resolve(args["path"])
    summary = f"list_files {args['pattern']} in {target.shown}"
    return PreparedCall(call, "read", summary, outside=not target.inside, arguments=args)


def run_list(ws: Workspace, settings: ToolSettings, prepared: PreparedCall) -> ToolOutcome:
    target = target_of(ws, prepared)
    _require_folder(target, "list_files")
    pattern: str = prepared.arguments["pattern"]
    matches = glob_matcher(pattern)
    listed = list_files(target.path, MAX_LISTED_FILES)
    found = [rel for rel in listed if matches(rel)]
    prefix = _prefix(target)
    budget = settings.max_output_kib * 1024
    lines: list[str] = []
    used = 0
    for rel in found[:MAX_SHOWN_FILES]:
        line = f"{prefix}{rel}"
        used += len(line.encode("utf-8")) + 1
        if used > budget:
            break
        lines.append(line)
    header = f"{count(len(found), 'file')} under {target.shown} match {pattern!r}"
    if len(listed) >= MAX_LISTED_FILES:
        header += f" (the listing stopped at {MAX_LISTED_FILES:,} files)"
    if not found:
        return ToolOutcome(header, details={"files": 0})
    body = "\n".join(lines)
    cut = len(found) - len(lines)
    note = f"\n... cut: {count(cut, 'more file')}; narrow the pattern or the path" if cut else ""
    return ToolOutcome(f"{header}\n{body}{note}", truncated=bool(cut), details={"files": len(found)})


# -- search -----------------------------------------------------------------------------------


def prepare_search(ws: Workspace, call: ToolCall, args: dict[str, Any]) -> PreparedCall:
    args.setdefault("path", ".")
    if not args["pattern"]:
        raise ToolError("the pattern is empty")
    if "glob" in args:
        glob_matcher(args["glob"])
    target = ws.resolve(args["path"])
    where = target.shown + (f" ({args['glob']})" if "glob" in args else "")
    summary = f"search {args['pattern']!r} in {where}"
    return PreparedCall(call, "read", summary, outside=not target.inside, arguments=args)


def run_search(
    ws: Workspace, settings: ToolSettings, prepared: PreparedCall, cancel: threading.Event
) -> ToolOutcome:
    target = target_of(ws, prepared)
    pattern: str = prepared.arguments["pattern"]
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"bad regular expression {pattern!r}: {exc}") from None
    if target.path.is_file():
        folder, files, prefix = target.path.parent, [target.path.name], ""
        shown_of: Callable[[str], str] = lambda rel: target.shown
    else:
        _require_folder(target, "search")
        folder, prefix = target.path, _prefix(target)
        files = list_files(target.path, MAX_LISTED_FILES)
        if "glob" in prepared.arguments:
            matches = glob_matcher(prepared.arguments["glob"])
            files = [rel for rel in files if matches(rel)]
        shown_of = lambda rel: f"{prefix}{rel}"
    rg = shutil.which("rg")
    hits = _search_rg(rg, pattern, folder, files, settings, cancel) if rg else None
    if hits is None:
        hits = _search_python(regex, folder, files, cancel)
    if cancel.is_set():
        return ToolOutcome("search: stopped by the user", ok=False, details={"stopped": "user"})
    more = len(hits) > MAX_MATCHES
    hits = hits[:MAX_MATCHES]
    budget = settings.max_output_kib * 1024
    lines: list[str] = []
    used = 0
    for rel, number, text in hits:
        line = f"{shown_of(rel)}:{number}: {shorten(text)}"
        used += len(line.encode("utf-8")) + 1
        if used > budget:
            more = True
            break
        lines.append(line)
    if not hits:
        return ToolOutcome(
            f"no matches for {pattern!r} in {count(len(files), 'file')}", details={"matches": 0}
        )
    in_files = len({rel for rel, _, _ in hits[: len(lines)]})
    header = f"{'first ' if more else ''}{count(len(lines), 'match')} in {count(in_files, 'file')}"
    note = "\n... cut: there are more matches; narrow the pattern, the path or the glob" if more else ""
    body = "\n".join(lines)
    return ToolOutcome(f"{header}\n{body}{note}", truncated=more, details={"matches": len(lines)})


def _search_python(
    regex: re.Pattern[str], folder: Path, files: list[str], cancel: threading.Event
) -> list[Hit]:
    """Python's `re`, line by line, over `files` in order; files holding a NUL byte (binary) and
    unreadable ones are skipped. Stops after `MAX_MATCHES + 1` hits."""
    hits: list[Hit] = []
    for rel in files:
        if cancel.is_set() or len(hits) > MAX_MATCHES:
            break
        try:
            data = (folder / rel).read_bytes()
        except OSError:
            continue
        if b"\0" in data:
            continue
        lines = decode(data).split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, 1):
            line = line.removesuffix("\r")
            if regex.search(line):
                hits.append((rel, number, line))
                if len(hits) > MAX_MATCHES:
                    break
    return hits


def _search_rg(
    rg: str, pattern: str, folder: Path, files: list[str], settings: ToolSettings, cancel: threading.Event
) -> list[Hit] | None:
    """ripgrep over `files` in sorted batches, the same hits as `_search_python` gives; None when
    ripgrep fails on them (a pattern its engine does not take, a file it cannot read): the caller
    searches with Python instead."""
    hits: list[Hit] = []
    for batch in _batches(files):
        if cancel.is_set() or len(hits) > MAX_MATCHES:
            break
        argv = [
            rg,
            "--json",
            "--no-config",
            "--crlf",
            "--max-count",
            str(MAX_MATCHES + 1),
            "-e",
            pattern,
            "--",
            *batch,
        ]
        try:
            done = subprocess.run(
                argv, cwd=folder, capture_output=True, timeout=settings.command_timeout_s, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode not in (0, 1):
            return None
        found = _parse_rg(done.stdout.splitlines())
        hits.extend(sorted(found))
    return hits[: MAX_MATCHES + 1]


def _parse_rg(lines: Iterable[bytes]) -> list[Hit]:
    """Matches from ripgrep's JSON lines, less those of files it found binary (a NUL byte)."""
    hits: list[Hit] = []
    pending: list[Hit] = []
    for raw in lines:
        event = json.loads(raw)
        data = event.get("data", {})
        if event.get("type") == "begin":
            pending = []
        elif event.get("type") == "match":
            text = _rg_text(data["lines"]).rstrip("\n").removesuffix("\r")
            pending.append((_rg_text(data["path"]), int(data["line_number"]), text))
        elif event.get("type") == "end":
            if data.get("binary_offset") is None:
                hits.extend(pending)
            pending = []
    return hits


def _rg_text(field: dict[str, str]) -> str:
    """ripgrep's text field: `text` when it is UTF-8, else base64 `bytes`."""
    if "text" in field:
        return field["text"]
    return decode(base64.b64decode(field["bytes"]))


def _batches(files: list[str]) -> Iterable[list[str]]:
    batch: list[str] = []
    size = 0
    for rel in files:
        if batch and size + len(rel) + 1 > RG_ARGV_CHARS:
            yield batch
            batch, size = [], 0
        batch.append(rel)
        size += len(rel) + 1
    if batch:
        yield batch


# -- shared -----------------------------------------------------------------------------------


def _require_folder(target: ResolvedPath, tool: str) -> None:
    if not target.path.exists():
        raise ToolError(f"{target.shown}: no such folder")
    if not target.path.is_dir():
        raise ToolError(f"{target.shown} is a file, not a folder: give its folder to {tool}")


def _prefix(target: ResolvedPath) -> str:
    """What goes before a path listed under `target` to show it (relative to the working folder
    when inside it)."""
    return "" if target.shown == "." else f"{target.shown.rstrip('/')}/"


def glob_matcher(pattern: str) -> Callable[[str], bool]:
    """A test of a relative posix path against a glob: `*` and `?` stay within one folder, `**`
    spans folders (`**/` also matches no folder), `[abc]`, `[!abc]` and `{a,b}` as in a shell.
    A pattern without `/` is tested against the file name alone, at any depth (`*.py`)."""
    pattern = pattern.strip().removeprefix("./")
    if not pattern:
        raise ToolError("the glob is empty")
    regex = re.compile(_glob_regex(pattern) + r"\Z")
    if "/" in pattern:
        return lambda rel: regex.match(rel) is not None
    return lambda rel: regex.match(rel.rsplit("/", 1)[-1]) is not None


def _glob_regex(pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append(f"[{'^' if negate else ''}{body.replace(chr(92), chr(92) * 2)}]")
            i = end + 1
        elif pattern[i] == "{" and "}" in pattern[i:]:
            end = pattern.index("}", i)
            options = pattern[i + 1 : end].split(",")
            out.append("(?:" + "|".join(_glob_regex(option) for option in options) + ")")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)
