"""The cgroup this process runs in, and whether the kernel shares the CPUs between it and the
work beside it.

Why it matters: Linux shares one CPU between the threads that want it, but with cgroup v2's
cpu controller it shares first between sibling cgroups (equal weights by default) and only then
between the threads inside each. One decode thread beside one busy process per core therefore
gets half a core when it shares a cgroup with them, and most of a core when they run in a
sibling cgroup (docs/threads.md; the measurements are in docs/results/threads.md).
A desktop gives every terminal tab and app its own cgroup (a systemd scope), so a compile in
another tab is a sibling; a compile in a pane of the same tmux server, or in the same shell, is
not. `velo-chat doctor` reports which case holds; `velo-chat bench --load N --load-cgroup`
measures the sibling case.

velo-chat does not move itself: leaving the cgroup it was started in would also leave the
memory and CPU limits someone set on it. `systemd-run --user --scope velo-chat` starts it in a
scope of its own where systemd runs the user's session.

Only cgroup v2 is read (a v1 or hybrid hierarchy reports `path = None`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import CgroupError

ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class CpuGroup:
    """Where this process is in the cgroup v2 hierarchy, as far as CPU sharing goes."""

    path: str | None  # e.g. "/user.slice/user-1000.slice/session-3.scope"; None: no cgroup v2
    cpu_separated: bool  # the parent runs the cpu controller: this group has a share of its own
    others: int | None  # processes in this cgroup besides this one (None: unreadable)

    @property
    def shared(self) -> bool:
        """Other processes share this cgroup's CPU share (their busy threads compete with ours
        thread for thread), or there is no controller to keep them apart."""
        return self.path is not None and (not self.cpu_separated or bool(self.others))

    def describe(self) -> str:
        if self.path is None:
            return "no cgroup v2 hierarchy (the CPUs are shared thread by thread)"
        sep = "its own CPU share" if self.cpu_separated else "no cpu controller above it"
        who = "" if self.others is None else f", {self.others} other process(es) in it"
        return f"{self.path} ({sep}{who})"

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "cpu_separated": self.cpu_separated,
            "others": self.others,
            "shared": self.shared,
        }


def own_path(proc_cgroup: Path = PROC_CGROUP) -> str | None:
    """This process's cgroup v2 path (the `0::` line), or None on a v1 or hybrid hierarchy
    whose v2 part is empty, or where /proc cannot be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    v1 = any(not line.startswith("0::") and line.split(":")[1] for line in lines if line.count(":") >= 2)
    for line in lines:
        if line.startswith("0::"):
            path = line[3:] or "/"
            # a hybrid hierarchy (v1 controllers, an empty v2 tree) says "0::/" for everyone
            return None if v1 and path == "/" else path
    return None


def _v2_path(root: Path, proc_cgroup: Path) -> str | None:
    """This process's cgroup v2 path where `root` is a cgroup v2 mount, else None."""
    path = own_path(proc_cgroup)
    return path if path is not None and (root / "cgroup.controllers").exists() else None


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def probe(root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP, pid: int | None = None) -> CpuGroup:
    """Read where this process runs and who shares its cgroup."""
    path = _v2_path(root, proc_cgroup)
    if path is None:
        return CpuGroup(None, False, None)
    here = root / path.lstrip("/")
    if path == "/":
        separated = False  # the root group: everything not placed elsewhere shares it
    else:
        separated = "cpu" in _words(here.parent / "cgroup.subtree_control")
    me = pid if pid is not None else os.getpid()
    try:
        procs = [int(p) for p in (here / "cgroup.procs").read_text().split()]
        others: int | None = sum(1 for p in procs if p != me)
    except (OSError, ValueError):
        others = None
    return CpuGroup(path, separated, others)


def neighbours_cores(
    seconds: float = 0.3, root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP
) -> float | None:
    """The cores' worth of CPU that the other processes in this cgroup used over `seconds`
    (the group's `cpu.stat` usage minus this process's own CPU time); None without cgroup v2."""
    path = _v2_path(root, proc_cgroup)
    if path is None:
        return None
    stat = root / path.lstrip("/") / "cpu.stat"

    def sample() -> tuple[float, float, float] | None:
        for line in _lines(stat):
            if line.startswith("usage_usec "):
                t = os.times()
                return time.monotonic(), int(line.split()[1]) / 1e6, t.user + t.system
        return None

    first = sample()
    if first is None:
        return None
    time.sleep(seconds)
    last = sample()
    if last is None or last[0] <= first[0]:
        return None
    others = (last[1] - first[1]) - (last[2] - first[2])
    return round(max(0.0, others) / (last[0] - first[0]), 2)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def make_sibling(name: str, root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP) -> Path:
    """Create a cgroup beside this process's own (same parent) and return its folder; raise
    `CgroupError` with one line when the hierarchy does not allow it."""
    path = _v2_path(root, proc_cgroup)
    if path is None:
        raise CgroupError("no cgroup v2 hierarchy here")
    if path == "/":
        raise CgroupError("this process runs in the root cgroup: there is no sibling to create")
    parent = (root / path.lstrip("/")).parent
    if "cpu" not in _words(parent / "cgroup.subtree_control"):
        raise CgroupError(f"the cpu controller is not enabled below {parent}")
    group = parent / name
    try:
        group.mkdir(exist_ok=True)
    except OSError as exc:
        raise CgroupError(f"cannot create {group}: {exc.strerror or exc}") from exc
    return group


def holds_processes(group: Path) -> bool:
    """Whether any process is still in `group` (False where it cannot be read)."""
    try:
        return bool((group / "cgroup.procs").read_text().strip())
    except OSError:
        return False


def remove(group: Path) -> None:
    """Remove an empty cgroup (the kernel refuses while a process is in it: then it stays)."""
    with contextlib.suppress(OSError):
        group.rmdir()
