"""The session's working folder as the tools see it: where a path argument really points, and
whether that is inside the folder.

A model names paths relative to the working folder, or absolute. What counts is where the path
lands once every symlink is followed, not how it is spelled: `../x`, `/etc/x`, or a symlink inside
the tree that points out of it are all outside, and anything outside always asks the user
(`PreparedCall.outside`). The tools then act on the resolved path, so an edit through a symlink
changes the file it points to and never replaces the link with a copy.

Paths are shown relative to the working folder when inside it (`src/app.py`), absolute otherwise:
short for the model, unambiguous for the user approving a call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class PathError(ValueError):
    """A path argument that names nothing usable (empty, holds a NUL): the model is told why."""


@dataclass(frozen=True)
class ResolvedPath:
    """A path argument once resolved: the real absolute path, whether it is inside the working
    folder, and how to show it."""

    path: Path
    inside: bool
    shown: str


class Workspace:
    """Resolves path arguments against a working folder `root` (itself resolved once)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.realpath(Path(root).expanduser()))

    def resolve(self, argument: str) -> ResolvedPath:
        """Resolve a path argument: relative to the root, or absolute (`~` is the user's home).
        Symlinks are followed as far as they exist; a path that does not exist yet (a file to
        write) is resolved through its existing parents. Raises `PathError` for an unusable one."""
        if not argument or not argument.strip():
            raise PathError("the path is empty")
        if "\0" in argument:
            raise PathError("the path contains a NUL character")
        given = Path(argument.strip()).expanduser()
        joined = given if given.is_absolute() else self.root / given
        real = Path(os.path.realpath(joined))
        inside = self.contains(real)
        return ResolvedPath(real, inside, self.show(real))

    def contains(self, path: Path) -> bool:
        """`path` (already resolved) is the root or below it."""
        return path == self.root or self.root in path.parents

    def show(self, path: Path) -> str:
        """`path` relative to the root (posix separators, "." for the root) when inside it, else
        absolute."""
        if not self.contains(path):
            return str(path)
        rel = path.relative_to(self.root).as_posix()
        return rel or "."
