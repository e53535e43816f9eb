"""How many CPU threads llama.cpp computes with, and how they wait (docs/threads.md).

Three parts:

- `plan_threads`: what `context.n_threads` (one-token decode) and `context.n_threads_batch`
  (prefill) resolve to. `"auto"` decodes a model whose every layer is on the GPU with
  `GPU_DECODE_THREADS` thread(s): the only CPU work of such a token is a tiny split (the input
  embeddings), and waking a pool of threads for it costs more than the split itself. Everything
  else uses the usable cores.
- `CpuLoad` and `ThreadGovernor`: while other processes keep the cores busy, compute with fewer
  threads. ggml's barrier between two ops spins until every thread of the pool has arrived; a
  thread the kernel has descheduled in favour of a compile makes the others spin for its whole
  time slice, so a pool larger than the free cores collapses (a tenth of its idle speed and
  unstable from run to run), where fewer threads keep their fair share.
- `Threadpools`: ggml thread pools made with explicit parameters (polling level, priority) and
  attached to the context (`llama_attach_threadpool`, which llama-cpp-python does not bind).
  Without them llama.cpp makes and joins a fresh pool for every graph.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .gpu_wait import GpuWait
from .gpu_wait import preview as preview_gpu_wait

if TYPE_CHECKING:
    from ..config.profile_schema import ContextSettings, Profile

log = logging.getLogger(__name__)

GPU_DECODE_THREADS = 1
"""Decode threads `auto` gives a model with every layer on the GPU: its token's CPU step is
small, and waking a pool of threads for it costs more than the step (docs/threads.md)."""

GGML_MAX_N_THREADS = 512


def usable_cores() -> int:
    """CPUs this process may run on (affinity-aware), the ceiling for llama.cpp threads."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def resolve_threads(requested: int | str, auto: int | None = None) -> int:
    """A thread setting as a count: `"auto"` is `auto` (default: the usable cores), 0 the usable
    cores; never more than the usable cores (oversubscribed, llama.cpp's threads wait for each
    other at every op and decode collapses)."""
    cores = usable_cores()
    if requested == "auto":
        requested = auto if auto is not None else cores
    n = int(requested)
    return cores if n <= 0 else min(n, cores)


@dataclass(frozen=True)
class ThreadPlan:
    """What the thread settings resolved to for one model on this machine."""

    decode: int  # threads for a one-token decode
    batch: int  # threads for prefill (several tokens per llama_decode)
    decode_setting: str  # as written in the profile: "auto" or a number
    batch_setting: str
    gpu_resident: bool  # every layer on the GPU (what `auto` decides by)
    cores: int
    adapt: bool  # fewer threads while other processes keep the cores busy
    pool: bool  # persistent ggml thread pools (else llama.cpp's pool per step)
    poll: int  # their polling level, 0..100
    gpu_wait: GpuWait | None = None  # how the CPU waits for the GPU (gpu_wait.py)

    @property
    def reason(self) -> str:
        where = "every layer on the GPU" if self.gpu_resident else "layers on the CPU"
        return f"{where}, {self.cores} usable cores"

    def describe(self) -> str:
        """One line: 'decode 1 (auto), prefill 16 (auto): every layer on the GPU, 16 cores'."""

        def one(n: int, setting: str) -> str:
            return f"{n} ({setting})" if setting == "auto" else str(n)

        busy = "; fewer while the machine is busy" if self.adapt else ""
        wait = self.gpu_wait.describe() if self.gpu_wait is not None else ""
        return (
            f"decode {one(self.decode, self.decode_setting)}, prefill "
            f"{one(self.batch, self.batch_setting)}: {self.reason}{busy}" + (f"; {wait}" if wait else "")
        )


def plan_threads(
    n_threads: int | str,
    n_threads_batch: int | str,
    *,
    gpu_resident: bool,
    adapt: bool = True,
    pool: bool = True,
    poll: int = 0,
    gpu_wait: GpuWait | None = None,
) -> ThreadPlan:
    cores = usable_cores()
    decode_auto = GPU_DECODE_THREADS if gpu_resident else cores
    return ThreadPlan(
        decode=resolve_threads(n_threads, decode_auto),
        batch=resolve_threads(n_threads_batch, cores),
        decode_setting=str(n_threads),
        batch_setting=str(n_threads_batch),
        gpu_resident=gpu_resident,
        cores=cores,
        adapt=adapt,
        pool=pool,
        poll=poll,
        gpu_wait=gpu_wait,
    )


def is_gpu_resident(n_gpu_layers: int, n_layer: int, supports_gpu: bool) -> bool:
    """Every layer (and the output layer, llama.cpp's n_layer + 1) offloaded to a GPU."""
    return supports_gpu and (n_gpu_layers < 0 or n_gpu_layers > n_layer)


def preview_plan(profile: Profile, model_path: Path | None) -> tuple[ThreadPlan, str]:
    """The plan a load of `profile` would make on this machine, without loading the model
    (`--print-config`): the layer count comes from the GGUF header. Returns the plan and a note
    ("" or why the GPU question could not be answered)."""
    ctx, n_gpu = profile.context, profile.model.n_gpu_layers
    note = ""
    gpu = False
    if n_gpu != 0:
        try:
            from ..llama.log import bindings  # our log first: asking may start CUDA's banner

            supports = bool(bindings().llama_supports_gpu_offload())
        except (ImportError, OSError) as exc:  # pragma: no cover - a broken install
            supports, note = False, f"llama.cpp not loadable: {exc}"
        if not supports:
            note = note or "this llama.cpp build has no GPU"
        elif n_gpu > 0:
            from ..llama import gguf_file

            try:
                if model_path is None:
                    raise FileNotFoundError("no model file")
                header = gguf_file.read_header(model_path)
                n_layer = int(header.metadata.get(f"{header.architecture}.block_count", 0))
                gpu = is_gpu_resident(n_gpu, n_layer, True)
            except (OSError, ValueError) as exc:
                note = f"layer count unknown ({exc}); assumed not all on the GPU"
        else:
            gpu = True
    wait = preview_gpu_wait(profile.model.gpu_wait, uses_gpu=n_gpu != 0)
    return plan_for(ctx, gpu, wait), note


def plan_for(ctx: ContextSettings, gpu_resident: bool, gpu_wait: GpuWait | None = None) -> ThreadPlan:
    """The plan for a profile's context section (and the model's `gpu_wait`, as resolved)."""
    return plan_threads(
        ctx.n_threads,
        ctx.n_threads_batch,
        gpu_resident=gpu_resident,
        adapt=ctx.adapt_threads,
        pool=ctx.thread_pool,
        poll=ctx.thread_poll,
        gpu_wait=gpu_wait,
    )


# -- the machine's load -------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSample:
    t: float  # time.monotonic()
    busy: float  # CPU-seconds not idle on our CPUs, niced work excluded (it yields to us)
    idle: float  # CPU-seconds idle (idle + iowait) on our CPUs
    own: float  # CPU-seconds this process used


class CpuLoad:
    """Reads how busy the CPUs this process may run on are (`/proc/stat`, Linux only).

    `others(a, b, threads)` estimates how many cores the *other* processes want, in cores. What
    they got is their share of /proc/stat's busy time minus ours; when no core was idle they may
    have wanted more, and were held back by our own `threads` runnable threads: with the kernel
    sharing the cores fairly, `other threads = got * threads / (cores - got)`.
    """

    def __init__(self, cpus: set[int] | None = None, stat_path: str = "/proc/stat") -> None:
        self.path = Path(stat_path)
        try:
            self.cpus = cpus if cpus is not None else set(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - non-Linux
            self.cpus = set()
        self.tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self.available = bool(self.cpus) and self.path.exists()

    def sample(self) -> LoadSample | None:
        if not self.available:
            return None
        busy = idle = 0
        try:
            with self.path.open("rb") as f:
                for line in f:
                    if not line.startswith(b"cpu"):
                        break  # the per-CPU lines come first
                    if not line[3:4].isdigit():
                        continue  # the all-CPU total
                    parts = line.split()
                    if int(parts[0][3:]) not in self.cpus:
                        continue
                    # user nice system idle iowait irq softirq steal
                    v = [int(x) for x in parts[1:9]]
                    busy += v[0] + v[2] + v[5] + v[6] + v[7]
                    idle += v[3] + v[4]
        except (OSError, ValueError, IndexError):
            log.warning("cannot read %s; thread adaptation is off", self.path, exc_info=True)
            self.available = False
            return None
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return LoadSample(time.monotonic(), busy / self.tick, idle / self.tick, ru.ru_utime + ru.ru_stime)

    def runnable_now(self) -> int | None:
        """Threads runnable on the whole machine at this instant (/proc/stat's `procs_running`,
        this one included), or None where it cannot be read."""
        if not self.available:
            return None
        try:
            with self.path.open("rb") as f:
                for line in f:
                    if line.startswith(b"procs_running"):
                        return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return None

    def others(self, a: LoadSample, b: LoadSample, threads: int) -> float:
        """Cores the other processes wanted between two samples (see the class doc)."""
        span = b.t - a.t
        if span <= 0:
            return 0.0
        cores = len(self.cpus)
        got = max(0.0, (b.busy - a.busy) - (b.own - a.own)) / span
        got = min(got, float(cores))
        idle = max(0.0, b.idle - a.idle) / span
        if threads <= 0 or idle >= 0.25 or got >= cores - 0.05:
            return got  # nothing of ours held them back
        return got * threads / (cores - got)


class ThreadGovernor:
    """Chooses the thread counts for the next llama_decode calls, at most every `interval` s.

    With no other load it keeps the plan's counts; while other processes want `d` cores it uses
    `cores - d` (rounded, at least 1, never more than the plan). A rise in the load is followed
    at once, a fall over a few windows (halving the difference each time): too many threads
    collapse, too few cost at most the difference between 1 and all threads.
    """

    def __init__(self, plan: ThreadPlan, *, probe: CpuLoad | None = None, interval: float = 0.25) -> None:
        self.plan = plan
        self.probe = probe or CpuLoad()
        self.interval = interval
        self.enabled = plan.adapt and self.probe.available
        self.decode = plan.decode
        self.batch = plan.batch
        self.others = 0.0
        self._last = self.probe.sample() if self.enabled else None
        self._next = time.monotonic() + interval

    def first_look(self, seconds: float = 0.1) -> tuple[int, int] | None:
        """Watch the machine for `seconds` while this process is idle, so the first step
        (a prefill ubatch can take seconds) already runs with what fits; the new counts if they
        differ from the plan's."""
        if not self.enabled:
            return None
        time.sleep(seconds)
        return self.update(0)

    def due(self, now: float) -> bool:
        return self.enabled and now >= self._next

    def update(self, threads_in_use: int) -> tuple[int, int] | None:
        """Take a sample; return the new (decode, batch) counts if they changed."""
        cur = self.probe.sample()
        now = time.monotonic()
        self._next = now + self.interval
        if cur is None or self._last is None:
            self.enabled = cur is not None
            self._last = cur
            return None
        wanted = self.probe.others(self._last, cur, threads_in_use)
        if cur.t - self._last.t > 10 * self.interval:
            # After a pause between turns: what the others used meanwhile, but no more than
            # what wants a core right now (this thread aside): a test run or another chat that
            # ended during the pause no longer holds the turn back (it did: a TUI turn after an
            # `ask` averaged 1.6-1.9 of 2 decode threads), while a compile still running counts.
            running = self.probe.runnable_now()
            self.others = wanted if running is None else min(wanted, float(max(running - 1, 0)))
        elif wanted > self.others:
            # More load: follow it at once (a pool larger than the free cores collapses).
            self.others = wanted
        else:
            self.others = 0.5 * self.others + 0.5 * wanted  # less load: step back up gently
        self._last = cur
        free = max(1, round(self.plan.cores - self.others))
        decode, batch = min(self.plan.decode, free), min(self.plan.batch, free)
        if (decode, batch) == (self.decode, self.batch):
            return None
        log.info(
            "threads: other processes want %.1f of %d cores; decode %d -> %d, prefill %d -> %d",
            self.others,
            self.plan.cores,
            self.decode,
            decode,
            self.batch,
            batch,
        )
        self.decode, self.batch = decode, batch
        return decode, batch


# -- ggml thread pools --------------------------------------------------------------------------


class ThreadpoolParams(ctypes.Structure):
    """`struct ggml_threadpool_params` (ggml.h of llama.cpp as vendored by 0.3.36)."""

    _fields_ = [
        ("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),  # enum ggml_sched_priority; 0 = normal (inherited)
        ("poll", ctypes.c_uint32),  # 0 = no polling .. 100 = aggressive
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


def _ggml_cpu() -> ctypes.CDLL | None:
    """libggml-cpu next to llama-cpp-python's libllama (already loaded by it)."""
    from llama_cpp import llama_cpp as ll

    lib_dir = Path(ll._lib._name).parent  # type: ignore[attr-defined]
    for name in ("libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll"):
        path = lib_dir / name
        if path.exists():
            lib = ctypes.CDLL(str(path))
            lib.ggml_threadpool_new.argtypes = [ctypes.POINTER(ThreadpoolParams)]
            lib.ggml_threadpool_new.restype = ctypes.c_void_p
            lib.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
            lib.ggml_threadpool_free.restype = None
            return lib
    return None


class Threadpools:
    """A decode pool and a prefill pool attached to one context. `close()` frees them: call it
    after `llama_free` (ggml's CPU backend keeps a pointer to the last pool it ran and pauses it
    before the next graph, so a pool must outlive every graph of its context)."""

    def __init__(self, ctx: ctypes.c_void_p, decode: int, batch: int, *, poll: int) -> None:
        from llama_cpp import llama_cpp as ll

        self._ll = ll
        self.ctx: ctypes.c_void_p | None = ctx
        lib = _ggml_cpu()
        if lib is None:
            raise OSError("libggml-cpu not found next to libllama")
        attach = ll._lib.llama_attach_threadpool  # type: ignore[attr-defined]
        attach.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        attach.restype = None
        self._lib = lib
        self.sizes = (decode, batch)
        self.pools: list[int] = []
        try:
            self.decode = self._new(decode, poll)
            self.batch = self._new(batch, poll) if batch != decode else self.decode
        except BaseException:
            self.close()
            raise
        attach(ctx, self.decode, self.batch)
        self._attach = attach

    def attach(self, batch_on_decode: bool) -> None:
        """Give batches the decode pool (`batch_on_decode`: a speculation verify batch, which
        runs like a token's step) or their own (prefill)."""
        self._attach(self.ctx, self.decode, self.decode if batch_on_decode else self.batch)

    def _new(self, n: int, poll: int) -> int:
        p = ThreadpoolParams()
        p.n_threads, p.prio, p.poll, p.strict_cpu, p.paused = n, 0, poll, False, False
        pool = self._lib.ggml_threadpool_new(ctypes.byref(p))
        if not pool:
            raise OSError(f"ggml_threadpool_new({n} threads) failed")
        self.pools.append(pool)
        return pool

    def close(self) -> None:
        self.ctx = None
        for pool in self.pools:
            self._lib.ggml_threadpool_free(pool)
        self.pools = []
