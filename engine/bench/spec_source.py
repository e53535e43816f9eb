"""The copy-edit workload of `bench --spec`: a source file given back with one name renamed.

The built-in workload is the standard library's `colorsys.py` with `_v` renamed to `_value`. It
says what speculation does on a file no one wrote for it, but not on the user's own code, model
and machine; `bench --spec --spec-file FILE` builds the same workload from any text file. The
prompt is the file attached as the app attaches it (`velo_chat.engine.render_user_content`) with
the rename request below it, so the workload is what a user attaching the file sends.

Which name to rename, when the user does not say (`--spec-rename OLD=NEW`): a name the file
defines and uses again, the one used most (the first defined among equals), as a person asking
for a rename would pick. In Python (`.py`, `.pyi`) the definitions are the file's functions and
classes, found by `ast`; elsewhere the names after a defining keyword of the common languages
(`def`, `function`, `fn`, `func`, `class`, `struct`, `#define`, `const`, ...). Dunder names are
never picked: renaming `__init__` changes what the code means, and the reply would not be a copy.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import PurePath

from .. import ChatMessage, SpecSourceError, render_user_content
from .attach import AttachedFile

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORD = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z_][A-Za-z0-9_]*")  # each whole name in a text
_DEFINITION = re.compile(
    r"(?:^|(?<=[\s;{(]))(?:#\s*define|def|class|function|fn|func|struct|enum|union|interface|trait|"
    r"type|typedef|let|const|var|val|sub|proc|macro|module)\s+(?:mut\s+)?([A-Za-z_][A-Za-z0-9_]*)",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class CopyEditSource:
    """A file's text and the rename the copy-edit prompt asks for."""

    name: str  # the file's name as the prompt shows it (never its directory)
    text: str
    old: str
    new: str
    kind: str = "name"  # "function", "class" or "name": how the prompt calls `old`

    @property
    def lines(self) -> int:
        return self.text.count("\n") + (0 if self.text.endswith("\n") else 1)

    def instruction(self) -> str:
        """The rename request a user types below the attached file."""
        uses = "call" if self.kind == "function" else "use"
        return (
            f"Rename the {self.kind} `{self.old}` to `{self.new}` everywhere (its definition and "
            f"every {uses}) and give back the whole file, nothing else."
        )

    def message(self) -> ChatMessage:
        """The user message: the file attached as the app attaches it, then the instruction,
        so the workload is exactly what a user attaching the file sends."""
        return ChatMessage("user", render_user_content([self.attached()], self.instruction()))

    def attached(self) -> AttachedFile:
        """The file as a user attaches it: under its name, with its text."""
        return AttachedFile(self.name, self.text)

    def describe(self) -> dict[str, object]:
        return {"file": self.name, "lines": self.lines, "rename": [self.old, self.new]}


def colorsys_source() -> CopyEditSource:
    """The built-in workload: `colorsys.py` (166 lines), its helper `_v` renamed to `_value`."""
    import colorsys
    import inspect

    return CopyEditSource("colorsys.py", inspect.getsource(colorsys), "_v", "_value", "function")


def uses(text: str, name: str) -> int:
    """How many times `name` occurs in `text` as a whole name (strings and comments count: a
    rename asked of a person changes them too)."""
    return len(re.findall(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text))


def _python_definitions(text: str) -> list[tuple[str, str]] | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((node.lineno, node.col_offset, node.name, "function"))
        elif isinstance(node, ast.ClassDef):
            found.append((node.lineno, node.col_offset, node.name, "class"))
    return [(name, kind) for *_pos, name, kind in sorted(found)]


def definitions(text: str, suffix: str) -> list[tuple[str, str]]:
    """The names `text` defines, in the order they are defined, each with its kind."""
    if suffix.lower() in (".py", ".pyi"):
        found = _python_definitions(text)
        if found is not None:
            return found
    return [(m.group(1), "name") for m in _DEFINITION.finditer(text)]


def pick_rename(text: str, suffix: str) -> tuple[str, str] | None:
    """The name to rename (and its kind): defined, used at least twice in all, not a dunder;
    the most used, the first defined among equals. None when the file has no such name."""
    counts = Counter(_WORD.findall(text))  # one pass: a 1 MiB file may define thousands
    best: tuple[int, str, str] | None = None
    seen: set[str] = set()
    for name, kind in definitions(text, suffix):
        if name in seen or len(name) < 2 or (name.startswith("__") and name.endswith("__")):
            continue
        seen.add(name)
        count = counts[name]
        if count >= 2 and (best is None or count > best[0]):
            best = (count, name, kind)
    return None if best is None else (best[1], best[2])


def new_name(old: str) -> str:
    """The name `old` is renamed to when the user does not say: `parse` -> `new_parse`,
    `Config` -> `NewConfig`, `_v` -> `_new_v`; never a name the text may already hold, which
    the caller checks."""
    lead = len(old) - len(old.lstrip("_"))
    core = old[lead:]
    if core[:1].isupper():
        return f"{old[:lead]}New{core}"
    return f"{old[:lead]}new_{core}"


def copy_edit_source(name: str, text: str, rename: str | None = None) -> CopyEditSource:
    """A copy-edit workload from a file's `name` and `text`. `rename`: "OLD=NEW" as the user
    typed it, or None to pick a name (`pick_rename`). Raises `SpecSourceError` saying why."""
    if not text.strip():
        raise SpecSourceError(f"--spec-file {name} is empty")
    suffix = PurePath(name).suffix
    if rename is not None:
        old, sep, new = (part.strip() for part in rename.partition("="))
        if not sep or not _NAME.fullmatch(old) or not _NAME.fullmatch(new) or old == new:
            raise SpecSourceError(f"--spec-rename takes OLD=NEW, two different names, got {rename!r}")
        if uses(text, old) == 0:
            raise SpecSourceError(f"--spec-rename: {old!r} does not occur in {name}")
        kind = dict(definitions(text, suffix)).get(old, "name")
    else:
        picked = pick_rename(text, suffix)
        if picked is None:
            raise SpecSourceError(
                f"--spec-file: found no name that {name} defines and uses again; "
                "say which to rename with --spec-rename OLD=NEW"
            )
        old, kind = picked
        new = new_name(old)
        while uses(text, new):
            new = new_name(new)
    if uses(text, new):
        raise SpecSourceError(f"--spec-rename: {new!r} already occurs in {name}; pick a new name")
    return CopyEditSource(name, text, old, new, kind)
