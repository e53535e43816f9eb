"""Where velo-chat runs in the cgroup v2 hierarchy (`engine/scheduling/cpu_group.py`), read from a cgroup
tree laid out as the kernel lays it out (real files in a temporary folder), and, where this
machine's own hierarchy lets a test create a cgroup, the benchmark's busy processes in one."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from velo_chat.engine.scheduling import cpu_group
from velo_chat.engine.bench import load as bench_load
from velo_chat.engine.bench.load import busy_processes


def _tree(tmp_path: Path, path: str, *, parent_controls: str, procs: list[int]) -> tuple[Path, Path]:
    """A cgroup2 root with this process at `path`; returns (root, the /proc/self/cgroup file)."""
    root = tmp_path / "cgroup"
    here = root / path.lstrip("/")
    here.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (here.parent / "cgroup.subtree_control").write_text(parent_controls + "\n")
    (here / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{path}\n")
    return root, proc


def test_a_v2_path_is_read_and_a_hybrid_hierarchy_is_not(tmp_path: Path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
    assert cpu_group.own_path(proc) == "/user.slice/user-1000.slice/session-3.scope"
    proc.write_text("4:memory:/docker/abc\n1:cpu:/\n0::/\n")  # v1 controllers, an empty v2 tree
    assert cpu_group.own_path(proc) is None
    assert cpu_group.own_path(tmp_path / "missing") is None


def test_a_group_shared_with_other_processes_and_one_of_its_own(tmp_path: Path):
    me = os.getpid()
    root, proc = _tree(
        tmp_path, "/user.slice/app.slice/tmux.scope", parent_controls="cpu memory", procs=[me, 7, 8]
    )
    group = cpu_group.probe(root, proc, pid=me)
    assert group == cpu_group.CpuGroup("/user.slice/app.slice/tmux.scope", True, 2) and group.shared
    assert "2 other process(es)" in group.describe()

    root, proc = _tree(tmp_path / "b", "/user.slice/app.slice/velo.scope", parent_controls="cpu", procs=[me])
    alone = cpu_group.probe(root, proc, pid=me)
    assert alone.cpu_separated and alone.others == 0 and not alone.shared

    root, proc = _tree(tmp_path / "c", "/session-3.scope", parent_controls="memory pids", procs=[me])
    no_cpu = cpu_group.probe(root, proc, pid=me)
    assert not no_cpu.cpu_separated and no_cpu.shared  # nothing keeps the neighbours' threads apart


def test_a_sibling_is_made_beside_this_group_or_refused_in_one_line(tmp_path: Path):
    root, proc = _tree(tmp_path, "/app.slice/term.scope", parent_controls="cpu", procs=[os.getpid()])
    sib = cpu_group.make_sibling("velo-chat-busy-1", root, proc)
    assert sib == root / "app.slice" / "velo-chat-busy-1" and sib.is_dir()
    cpu_group.remove(sib)
    assert not sib.exists()

    root, proc = _tree(tmp_path / "b", "/app.slice/term.scope", parent_controls="memory", procs=[1])
    with pytest.raises(cpu_group.CgroupError, match="cpu controller is not enabled"):
        cpu_group.make_sibling("x", root, proc)
    proc.write_text("0::/\n")
    with pytest.raises(cpu_group.CgroupError, match="root cgroup"):
        cpu_group.make_sibling("x", root, proc)
    with pytest.raises(cpu_group.CgroupError, match="no cgroup v2"):
        cpu_group.make_sibling("x", tmp_path / "nowhere", proc)


def _can_make_a_sibling() -> str | None:
    try:
        cpu_group.remove(cpu_group.make_sibling(f"velo-chat-test-{os.getpid()}"))
    except cpu_group.CgroupError as exc:
        return str(exc)
    return None


def test_busy_processes_run_in_a_cgroup_beside_this_one_and_it_is_removed_after():
    """Needs a cgroup v2 hierarchy that lets this process create a sibling (the GPU machine
    does; a desktop user's own slice may): skipped elsewhere, with the reason."""
    why = _can_make_a_sibling()
    if why is not None:
        pytest.skip(f"cannot create a cgroup here: {why}")
    path = cpu_group.own_path()
    assert path is not None
    group = cpu_group.ROOT / path.lstrip("/")
    sibling = group.parent / f"velo-chat-busy-{os.getpid()}"
    with busy_processes(2, cgroup=True, settle_s=0.5):
        pids = [int(p) for p in (sibling / "cgroup.procs").read_text().split()]
        assert len(pids) == 3  # the session's leader and its two loops
        mine = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        assert os.getpid() in mine and not set(pids) & set(mine)
        assert b"python" in Path(f"/proc/{pids[-1]}/cmdline").read_bytes()
    for _ in range(100):
        if not sibling.exists():
            break
        time.sleep(0.05)
    assert not sibling.exists()


def test_busy_processes_that_cannot_join_their_cgroup_raise_instead_of_measuring_idle(tmp_path, monkeypatch):
    """Where the kernel refuses the move (a cgroup.procs the user may not write), the leader
    exits at once: the benchmark says so rather than timing an idle machine as a busy one."""
    group = tmp_path / "velo-chat-busy"
    (group / "cgroup.procs").mkdir(parents=True)  # open(..., "w") fails on it
    monkeypatch.setattr(bench_load, "make_sibling_cgroup", lambda name: group)
    with pytest.raises(cpu_group.CgroupError, match="could not join"):
        with busy_processes(2, cgroup=True, settle_s=0.5):
            pytest.fail("the block ran without its busy processes")
