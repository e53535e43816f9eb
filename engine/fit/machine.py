"""What the machine has: memory from /proc/meminfo, the GPU from nvidia-smi, the llama.cpp build.

`MemAvailable` is the kernel's own estimate of what can be allocated without swapping (free
memory plus the page cache and slab it can reclaim); it is the figure the fit check compares
with. On a GPU with unified memory (DGX Spark's GB10) the GPU allocates from the same RAM and
CUDA's free-memory figure is not the one to trust, so the whole estimate is compared with
`MemAvailable`; on a discrete GPU the GPU's terms are compared with its free memory.

Such a machine also stalls instead of failing when its memory runs out (a DGX Spark neither
swaps nor lets the OOM killer end one process: it livelocks until it is power cycled), so there
the check keeps a margin free beside everything it counts (`margin_bytes`, docs/fit.md).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..scheduling.threads import usable_cores

log = logging.getLogger(__name__)

MEMINFO = Path("/proc/meminfo")  # read at each call: a test points it at a file of its own
CPUINFO = Path("/proc/cpuinfo")

MARGIN_FLOOR = 4 << 30
MARGIN_SHARE = 20  # 1/20: 5% of the RAM


def margin_bytes(mem_total: int) -> int:
    """What must stay available on a machine whose GPU shares its RAM: max(4 GiB, 5% of the
    RAM). The kernel, the desktop and whatever else runs keep allocating after the check (a
    browser tab, a build, the page cache's own bookkeeping), and there running out means a
    power cycle, not an error: the floor covers a small machine's desktop, the share grows
    with what a big machine runs beside the model."""
    return max(MARGIN_FLOOR, mem_total // MARGIN_SHARE)


@dataclass(frozen=True)
class MemInfo:
    total: int
    available: int
    swap_total: int
    swap_free: int
    cached: int


def meminfo(path: Path | None = None) -> MemInfo:
    """Bytes from /proc/meminfo, or from `path` (zeros where a field is missing)."""
    fields: dict[str, int] = {}
    try:
        text = (path or MEMINFO).read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return MemInfo(
        total=fields.get("MemTotal", 0),
        available=fields.get("MemAvailable", fields.get("MemFree", 0)),
        swap_total=fields.get("SwapTotal", 0),
        swap_free=fields.get("SwapFree", 0),
        cached=fields.get("Cached", 0),
    )


def cpu_flags(path: Path = CPUINFO) -> frozenset[str]:
    """The instruction-set flags the first CPU reports (x86's `flags`, Arm's `Features`);
    empty where /proc/cpuinfo is missing or says none."""
    try:
        text = path.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(rest.split())
    return frozenset()


@dataclass(frozen=True)
class Gpu:
    name: str
    total: int | None  # bytes; None where nvidia-smi reports none (unified memory)
    free: int | None
    driver: str
    integrated: bool  # shares the system RAM (GB10): compare with MemAvailable


def _mib(value: str) -> int | None:
    value = value.strip()
    return int(float(value)) << 20 if value.replace(".", "", 1).isdigit() else None


def nvidia_smi_rows(query: str, timeout: float = 5.0) -> list[list[str]]:
    """`nvidia-smi --query-gpu=QUERY` as one list of stripped fields per GPU (none when the
    tool is absent or fails: a machine without an NVIDIA driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("nvidia-smi (%s) failed: %s", query, exc)
        return []
    return [[p.strip() for p in line.split(",")] for line in out.splitlines()]


def gpus(timeout: float = 5.0) -> list[Gpu]:
    """The NVIDIA GPUs nvidia-smi lists (none when it is absent or fails)."""
    found = []
    for parts in nvidia_smi_rows("name,memory.total,memory.free,driver_version", timeout):
        if len(parts) < 4:
            continue
        total, free = _mib(parts[1]), _mib(parts[2])
        # GB10 (DGX Spark) has no memory of its own: nvidia-smi reports "[N/A]".
        integrated = total is None or "GB10" in parts[0]
        found.append(Gpu(parts[0], total, free, parts[3], integrated))
    return found


@dataclass(frozen=True)
class Machine:
    """What the fit check compares with."""

    mem: MemInfo
    gpu_offload: bool  # the llama.cpp build can put layers on a GPU
    gpu: Gpu | None  # the first GPU, if any

    @property
    def unified(self) -> bool:
        """GPU allocations come out of system RAM (or there is no GPU)."""
        return self.gpu is None or self.gpu.integrated or not self.gpu_offload

    @property
    def shared_with_gpu(self) -> bool:
        """The machine's GPU has no memory of its own (GB10): whatever the llama.cpp build,
        running out of RAM stalls the whole machine."""
        return self.gpu is not None and self.gpu.integrated

    @property
    def margin(self) -> int:
        """Bytes that must stay available after a load (`margin_bytes`); 0 where running out
        fails a process instead of stalling the machine."""
        return margin_bytes(self.mem.total) if self.shared_with_gpu else 0


def llama_gpu_offload() -> bool:
    """Whether the installed llama.cpp can offload layers to a GPU (a CUDA/Metal/... build).

    Asking initialises ggml's backends, and CUDA's logs a banner then: the log goes through
    ours first (`llama_bindings`)."""
    return bool(llama_bindings().llama_supports_gpu_offload())


def llama_bindings() -> ModuleType:
    """llama-cpp-python's `llama_cpp.llama_cpp`, with llama.cpp's log routed into ours first:
    call through this wherever a command may be the first to touch llama.cpp."""
    from ..llama import log as llama_log

    return llama_log.bindings()


def probe(meminfo_path: Path | None = None) -> Machine:
    """The machine now. The GPU is looked for whatever the build: a Spark's RAM is shared with
    its GPU, and stalls when it runs out, even when llama.cpp runs on its CPU alone."""
    offload = llama_gpu_offload()
    found = gpus()
    return Machine(meminfo(meminfo_path), offload, found[0] if found else None)


@dataclass(frozen=True)
class LoadAverage:
    """The cores this process may run on and the 1-minute load average (runnable tasks), for
    doctor's advice (the decode's own sampling of the CPUs is `engine/scheduling/threads.py: CpuLoad`)."""

    cores: int
    load1: float

    @property
    def busy_advice(self) -> str | None:
        """What to say when other work keeps every core busy. One decode thread then shares a
        core with a busy process and gets about half of it; with one core left free it keeps
        nearly its idle speed (docs/threads.md)."""
        if self.load1 < self.cores - 0.5:
            return None
        free = max(1, self.cores - 1)
        return (
            f"the cores are busy (load {self.load1:.1f} on {self.cores} cores): decode shares a core "
            f"with that work and can lose half its speed; leave a core free (e.g. make -j{free}) "
            "or run the other work under nice"
        )


def load_average(loadavg: Path = Path("/proc/loadavg")) -> LoadAverage:
    try:
        load1 = float(loadavg.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        load1 = 0.0
    return LoadAverage(usable_cores(), load1)
