"""How the CPU thread waits for the GPU: CUDA's device scheduling flags (`[model] gpu_wait`).

A model with its layers on the GPU still has a CPU thread that submits each step's graph and
then waits for the GPU to finish it (a stream synchronize). How it waits is a CUDA device flag:

- "spin": poll until the GPU is done. The lowest latency on an idle machine, but the thread is
  always runnable: beside busy processes the kernel time-slices it against them, and the GPU
  sits idle for whole slices while the thread is descheduled.
- "yield": poll, yielding the core between polls. Still always runnable.
- "block": sleep on an interrupt until the GPU is done (`cudaDeviceScheduleBlockingSync`). The
  thread uses almost no CPU while the GPU works, so beside busy processes the scheduler wakes
  it at once (a sleeper has used little CPU time) and decode keeps its speed.

CUDA's own default (`cudaDeviceScheduleAuto`) spins whenever the process has fewer CUDA
contexts than the machine has cores, that is on every discrete-GPU machine that matters here;
ggml sets "spin" itself on the GB10 (DGX Spark) to avoid slow synchronizes there.

`"auto"` sets `AUTO_MODE` on a discrete GPU and leaves an integrated one (DGX Spark, Jetson) as
llama.cpp sets it. `AUTO_MODE` is None: "auto" keeps CUDA's default (and restores it after a
load that set another mode). With a fast model on a discrete GPU "block" was slower idle and no
faster beside busy processes; a Spark's larger model may differ, which
`benchmarks/device/device_threads.sh` and `velo-chat bench --load` measure (docs/threads.md).

The flags are set through the CUDA runtime library that llama.cpp's CUDA backend uses (the
`libcudart` already mapped into this process), after llama.cpp has initialised that backend
(ggml sets its own flags then) and before the model is loaded. A build without CUDA, or a
model with no layer on the GPU, touches nothing.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

CHOICES = ("auto", "spin", "yield", "block")
FLAGS = {"spin": 0x01, "yield": 0x02, "block": 0x04}  # cudaDeviceSchedule{Spin,Yield,BlockingSync}
SCHEDULE_MASK = 0x07
ATTR_INTEGRATED = 18  # cudaDevAttrIntegrated
AUTO_MODE: str | None = None  # what "auto" sets on a discrete GPU; None: CUDA's default
NO_GPU_LAYER = "no layer on the GPU"
NO_CUDA = "no CUDA in this llama.cpp build"
CUDA_DEFAULT = "CUDA's default"
_ORIGINAL: dict[int, str] = {}  # each device's flag before this process first set one


@dataclass(frozen=True)
class GpuWait:
    """What `gpu_wait` resolved to for one load."""

    setting: str  # as written in the profile
    mode: str | None  # "spin", "yield" or "block"; None: left as llama.cpp and CUDA set it
    reason: str = ""  # why None, or why auto chose the mode

    def describe(self) -> str:
        """For the threads line: 'GPU wait block (auto)', 'GPU wait spin', 'GPU wait as CUDA
        sets it (auto: CUDA's default)'; "" where no GPU is involved."""
        if self.mode is None and self.reason in (NO_GPU_LAYER, NO_CUDA):
            return ""
        if self.mode is None:
            return f"GPU wait as CUDA sets it ({self.setting}: {self.reason})"
        return f"GPU wait {self.mode}" + (" (auto)" if self.setting == "auto" else "")

    def as_dict(self) -> dict[str, str | None]:
        return {"setting": self.setting, "mode": self.mode, "reason": self.reason}


def _mapped_cudart() -> str | None:
    """The path of the libcudart this process has mapped (llama.cpp's CUDA backend links it
    dynamically), or None: no CUDA build, a static runtime, or no /proc (not Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if path.startswith("/") and Path(path).name.startswith("libcudart.so"):
                    return path
    except OSError:
        return None
    return None


class CudaRuntime:
    """The few runtime calls this needs, on the library llama.cpp uses (same process state)."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        p_int, p_uint = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint)
        for name, args in (
            ("cudaGetDeviceCount", [p_int]),
            ("cudaGetDevice", [p_int]),
            ("cudaSetDevice", [ctypes.c_int]),
            ("cudaGetDeviceFlags", [p_uint]),
            ("cudaSetDeviceFlags", [ctypes.c_uint]),
            ("cudaDeviceGetAttribute", [p_int, ctypes.c_int, ctypes.c_int]),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.lib = lib
        self.path = path

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(f"{what} failed (cudaError {rc})")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        self._check(self.lib.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
        return n.value

    def integrated(self, device: int) -> bool:
        v = ctypes.c_int(0)
        rc = self.lib.cudaDeviceGetAttribute(ctypes.byref(v), ATTR_INTEGRATED, device)
        return rc == 0 and bool(v.value)

    def schedule(self, device: int) -> str:
        """The scheduling flag now in force on `device` ("auto" for CUDA's default)."""
        flags = self._on(device, self._flags)
        names = {v: k for k, v in FLAGS.items()}
        return names.get(flags & SCHEDULE_MASK, "auto")

    def set_schedule(self, device: int, mode: str | None) -> None:
        """Set `mode` ("spin", "yield", "block"; None: CUDA's heuristic) on `device`."""

        def change() -> None:
            other = self._flags() & ~SCHEDULE_MASK  # keep map-host and friends
            bit = FLAGS[mode] if mode is not None else 0
            self._check(self.lib.cudaSetDeviceFlags(other | bit), "cudaSetDeviceFlags")

        self._on(device, change)

    def _flags(self) -> int:
        f = ctypes.c_uint(0)
        self._check(self.lib.cudaGetDeviceFlags(ctypes.byref(f)), "cudaGetDeviceFlags")
        return f.value

    def _on(self, device: int, fn: Callable[[], T]) -> T:
        """Run `fn` with `device` current on this thread, then restore the current device."""
        prev = ctypes.c_int(0)
        self._check(self.lib.cudaGetDevice(ctypes.byref(prev)), "cudaGetDevice")
        self._check(self.lib.cudaSetDevice(device), "cudaSetDevice")
        try:
            return fn()
        finally:
            self.lib.cudaSetDevice(prev.value)


def cuda_runtime() -> CudaRuntime | None:
    """llama.cpp's CUDA runtime, once its CUDA backend is initialised; None without one.
    Asking llama.cpp whether it can offload initialises its backends (ggml sets its own device
    flags then), so a flag set afterwards is the one that stays."""
    try:
        from llama_cpp import llama_cpp as ll

        if not ll.llama_supports_gpu_offload():
            return None
    except (ImportError, OSError):  # pragma: no cover - a broken install
        return None
    path = _mapped_cudart()
    if path is None:
        return None
    try:
        return CudaRuntime(path)
    except (OSError, AttributeError) as exc:
        log.warning("gpu_wait: cannot use %s (%s)", path, exc)
        return None


def resolve(setting: str, *, uses_gpu: bool, runtime: CudaRuntime | None) -> GpuWait:
    """What `setting` means for a model that does (`uses_gpu`) or does not put layers on a GPU
    of this build (`runtime`: llama.cpp's CUDA runtime, None on a build without one)."""
    if setting not in CHOICES:
        raise ValueError(f"gpu_wait must be one of {', '.join(CHOICES)}; got {setting!r}")
    if not uses_gpu:
        return GpuWait(setting, None, NO_GPU_LAYER)
    if runtime is None:
        return GpuWait(setting, None, NO_CUDA)
    if setting != "auto":
        return GpuWait(setting, setting)
    if AUTO_MODE is None:
        return GpuWait(setting, None, CUDA_DEFAULT)
    try:
        count = runtime.device_count()
    except OSError as exc:
        return GpuWait(setting, None, str(exc))
    if count == 0:
        return GpuWait(setting, None, "no CUDA device")
    if any(runtime.integrated(d) for d in range(count)):
        return GpuWait(setting, None, "integrated GPU, left as llama.cpp sets it")
    return GpuWait(setting, AUTO_MODE)


def apply(setting: str, *, uses_gpu: bool) -> GpuWait:
    """Resolve `setting` and set it on every CUDA device; call before the model loads. The flag
    holds for the whole process: a load that sets nothing puts back what an earlier load of
    this process changed. A failure is logged and leaves CUDA's default (the load goes on)."""
    runtime = cuda_runtime()
    wait = resolve(setting, uses_gpu=uses_gpu, runtime=runtime)
    if wait.mode is None or runtime is None:
        if runtime is not None and _ORIGINAL:
            _restore(runtime)
        log.info("gpu_wait %s: nothing set (%s)", setting, wait.reason)
        return wait
    try:
        for device in range(runtime.device_count()):
            _ORIGINAL.setdefault(device, runtime.schedule(device))
            runtime.set_schedule(device, wait.mode)
            now = runtime.schedule(device)
            if now != wait.mode:
                raise OSError(f"device {device} reads back {now!r}")
    except OSError as exc:
        log.warning("gpu_wait %s: could not set %s (%s); CUDA's default stays", setting, wait.mode, exc)
        return GpuWait(setting, None, f"setting it failed: {exc}")
    log.info("gpu_wait %s: CUDA devices wait by %s (%s)", setting, wait.mode, runtime.path)
    return wait


def _restore(runtime: CudaRuntime) -> None:
    """Put back each device's flag as it was before this process first set one."""
    try:
        for device, mode in _ORIGINAL.items():
            runtime.set_schedule(device, mode if mode in FLAGS else None)  # "auto": no bit
    except OSError as exc:
        log.warning("gpu_wait: could not restore CUDA's default (%s)", exc)


def preview(setting: str, *, uses_gpu: bool) -> GpuWait:
    """What a load would set, without setting it (`--print-config`)."""
    return resolve(setting, uses_gpu=uses_gpu, runtime=cuda_runtime() if uses_gpu else None)
