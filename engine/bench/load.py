"""The threads and load sections of `velo-chat bench` (docs/threads.md).

- threads: the decode section again with each fixed thread count (`--threads 1,2,4`), beside
  the planned (`auto`) one, in the same process and run.
- load: the decode section again while `N` busy processes (`--load N`: each a Python loop that
  never sleeps, like one compiler job) run beside it, with the fixed counts too; its ratio to
  the idle decode is what a chat keeps of its speed while the machine compiles. By default the
  busy processes share one session of their own, as the jobs of a compile started from another
  terminal do, in velo-chat's cgroup (as in a pane of the same tmux server): every thread then
  counts alike. With `cgroup` they run in a cgroup beside velo-chat's, as a desktop runs a
  compile started in another terminal tab: with cgroup v2's cpu controller the two groups share
  the CPUs first and the threads within each (`engine/scheduling/cpu_group.py`). With `same_session` they
  are this process's children (docs/threads.md). (Linux's autogroup, which groups by session,
  applies only to processes in the root cgroup.)

Every decode row carries `other_cores`: how much CPU the rest of the machine used meanwhile
(/proc/stat minus this process), so a figure from a machine someone else was using says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import CgroupError
from ..diagnostics import (
    CpuLoad,
    Diagnostics,
    cgroup_holds_processes,
    make_sibling_cgroup,
    remove_cgroup,
)
from ..fit import probe_cpu_group

if TYPE_CHECKING:
    from .result import BenchResult

log = logging.getLogger(__name__)

# A busy loop that ends by itself once its parent is gone, so a benchmark killed mid-run (a
# timeout, Ctrl-C twice, SIGKILL) never leaves processes spinning on the user's cores.
BUSY_LOOP = (
    "import os\n"
    "parent, i = os.getppid(), 0\n"
    "while True:\n"
    "    i += 1\n"
    "    if i % 2000000 == 0 and os.getppid() != parent:\n"
    "        break\n"
)
# The leader of a separate session: starts the busy loops, then waits; killed with them, or when
# the benchmark that started it is gone, it kills its whole group.
LEADER = (
    "import os, signal, subprocess, sys, time\n"
    "parent = os.getppid()\n"
    "if len(sys.argv) > 3:\n"  # a cgroup to run in: joined before any loop starts
    "    with open(sys.argv[3], 'w') as f: f.write(str(os.getpid()))\n"
    "procs = [subprocess.Popen([sys.executable, '-S', '-c', sys.argv[2]])\n"
    "         for _ in range(int(sys.argv[1]))]\n"
    "while os.getppid() == parent:\n"
    "    time.sleep(0.2)\n"
    "os.killpg(0, signal.SIGKILL)\n"
)
Decode = Callable[[str], dict[str, Any]]


def check_load_cgroup() -> None:
    """Raise `CgroupError` (one line) now where `busy_processes(cgroup=True)` could not make
    the busy processes' cgroup beside this process's, before a model is loaded."""
    remove_cgroup(make_sibling_cgroup(f"velo-chat-busy-{os.getpid()}"))


@contextlib.contextmanager
def busy_processes(
    n: int, *, same_session: bool = False, cgroup: bool = False, settle_s: float = 1.0
) -> Iterator[None]:
    """`n` processes that keep one core each busy until the block ends, then are killed: in a
    session (and process group) of their own, or as this process's children. With `cgroup`
    their session runs in a cgroup of its own beside this process's (`make_sibling_cgroup`;
    raises `CgroupError` where the hierarchy does not allow it), as a desktop runs a compile
    started in another terminal tab."""
    procs: list[subprocess.Popen] = []
    quiet: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL}
    group = make_sibling_cgroup(f"velo-chat-busy-{os.getpid()}") if cgroup and n else None
    try:
        if same_session:
            for _ in range(n):
                procs.append(subprocess.Popen([sys.executable, "-S", "-c", BUSY_LOOP], **quiet))
        elif n:
            join = [str(group / "cgroup.procs")] if group is not None else []
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-S", "-c", LEADER, str(n), BUSY_LOOP, *join],
                    start_new_session=True,
                    **quiet,
                )
            )
        time.sleep(settle_s)  # let them start spinning before anything is timed
        if group is not None and procs and procs[0].poll() is not None:
            raise CgroupError(f"the busy processes could not join {group} (see the kernel's rules)")
        yield
    finally:
        for p in procs:
            if same_session:
                p.kill()
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)  # the group this leader started
        for p in procs:
            p.wait()
        if group is not None:
            for _ in range(50):  # the killed loops leave the group within moments
                if not cgroup_holds_processes(group):
                    break
                time.sleep(0.02)
            remove_cgroup(group)


@contextlib.contextmanager
def measure_load() -> Iterator[dict[str, Any]]:
    """Fills the yielded dict on exit: `other_cores`, the cores' worth of CPU time that other
    processes used during the block, and `own_cores`, what this process used (None where
    /proc/stat cannot be read)."""
    probe = CpuLoad()
    out: dict[str, Any] = {"other_cores": None, "own_cores": None}
    first = probe.sample()
    try:
        yield out
    finally:
        last = probe.sample()
        if first is not None and last is not None and last.t > first.t:
            used = (last.busy - first.busy) - (last.own - first.own)
            out["other_cores"] = round(max(0.0, used) / (last.t - first.t), 2)
            out["own_cores"] = round((last.own - first.own) / (last.t - first.t), 2)


def _row(n: int, d: dict[str, Any]) -> dict[str, Any]:
    return {
        "decode_threads": n,
        "tok_s": d["tok_s"],
        "tok_s_runs": d["tok_s_runs"],
        "other_cores": d["other_cores"],
        "own_cores": d.get("own_cores"),
    }


def _fixed(diag: Diagnostics, decode: Decode, counts: tuple[int, ...], where: str) -> list[dict[str, Any]]:
    rows = []
    for n in counts:
        with diag.fixed_threads(n):
            n = diag.threads_now[0]  # never more than the usable cores
            rows.append(_row(n, decode(f" with {n} threads{where}")))
    return rows


def threads_section(
    diag: Diagnostics, decode: Decode, counts: tuple[int, ...], *, auto: dict[str, Any]
) -> dict[str, Any]:
    rows = _fixed(diag, decode, counts, "")
    best = max(rows, key=lambda r: r["tok_s"])
    return {
        "fixed": rows,
        "best_fixed": best["decode_threads"],
        "auto_over_best": round(auto["tok_s"] / best["tok_s"], 3) if best["tok_s"] else None,
    }


def load_section(
    diag: Diagnostics,
    decode: Decode,
    n_busy: int,
    counts: tuple[int, ...],
    *,
    idle: BenchResult,
    same_session: bool = False,
    cgroup: bool = False,
) -> dict[str, Any]:
    """Run inside `busy_processes(n_busy)`."""
    loaded = decode(f" beside {n_busy} busy processes")
    base = idle.decode["tok_s"]
    section: dict[str, Any] = {
        "busy_processes": n_busy,
        "same_session": same_session,
        "cgroup": cgroup,  # the busy processes ran in a cgroup beside this process's
        "own_cgroup": probe_cpu_group().to_json(),
        "decode": loaded,
        "over_idle": round(loaded["tok_s"] / base, 3) if base else None,
        "worst_run_over_idle": round(min(loaded["tok_s_runs"]) / base, 3) if base else None,
    }
    if counts:
        rows = _fixed(diag, decode, counts, f" beside {n_busy} busy processes")
        for row in rows:
            row["over_idle"] = round(row["tok_s"] / base, 3) if base else None
        section["fixed"] = rows
    return section


def _runs(d: dict[str, Any]) -> str:
    others = d.get("other_cores")
    busy = f", others used {others:.2f} cores" if others is not None else ""
    return f"runs {', '.join(f'{x:.1f}' for x in d['tok_s_runs'])}{busy}"


def _placement(ld: dict[str, Any]) -> str:
    if ld.get("same_session"):
        return "this session and cgroup"
    return "their own session, " + (
        "a cgroup beside velo-chat's" if ld.get("cgroup") else "velo-chat's cgroup"
    )


def format_load_lines(result: BenchResult) -> list[str]:
    """The table lines for the decode runs and the threads and load sections."""
    d = result.decode
    lines = [f"          decode {_runs(d)}; threads at the end {d['threads_after'][0]}"]
    t = result.sections.get("threads")
    if t:
        lines += ["", "threads   decode tok/s with fixed thread counts (same run):"]
        lines += [
            f"          {r['decode_threads']:>3}: {r['tok_s']:>10,.1f}   ({_runs(r)})" for r in t["fixed"]
        ]
        lines.append(f"          auto / best fixed ({t['best_fixed']}) = {t['auto_over_best']:.3f}")
    ld = result.sections.get("load")
    if ld:
        x = ld["decode"]
        lines += [
            "",
            f"load      decode beside {ld['busy_processes']} busy processes "
            f"({_placement(ld)}): {x['tok_s']:.1f} "
            f"tok/s = {ld['over_idle']:.3f} x idle (worst run {ld['worst_run_over_idle']:.3f})",
            f"          {_runs(x)}; threads at the end {x['threads_after'][0]}",
        ]
        lines += [
            f"          {r['decode_threads']:>3} fixed: {r['tok_s']:>10,.1f} = "
            f"{r['over_idle']:.3f} x idle ({_runs(r)})"
            for r in ld.get("fixed", [])
        ]
    return lines
