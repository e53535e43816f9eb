"""The few CUDA runtime/driver calls the in-place PLE table needs, imported lazily.

CuPy 14 exposes `hostRegister`, `hostUnregister` and `deviceGetAttribute` in `cupy.cuda.runtime`,
but not `cudaHostGetDevicePointer`. That one is only needed on a device that cannot use the host
address of registered memory directly (`cudaDevAttrCanUseHostPointerForRegisteredMem` = 0), so it
is called through ctypes on the driver library (`cuMemHostGetDevicePointer`), which is always
present where a GPU is.

`launch_kernel` calls `cuLaunchKernel` with arguments packed once (`PackedArgs`) on a raw
`cudaStream_t`: the later llama.cpp integration launches on llama.cpp's own stream every ubatch,
and this needs no CuPy stream wrapper or per-call argument boxing. It is not a speed-up: a launch
and synchronize cost about the same through CuPy (docs/results/ple.md). Nothing here runs at
import time.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# cudaDeviceAttr / CUdevice_attribute values (identical in both APIs)
ATTR_CAN_MAP_HOST_MEMORY = 19
ATTR_PAGEABLE_MEMORY_ACCESS = 88
ATTR_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91
ATTR_HOST_REGISTER_SUPPORTED = 99
ATTR_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 100
ATTR_READ_ONLY_HOST_REGISTER_SUPPORTED = 113

# cudaHostRegister flags
HOST_REGISTER_MAPPED = 0x02
HOST_REGISTER_READ_ONLY = 0x08


def cupy_runtime() -> Any:
    """`cupy.cuda.runtime`, or ImportError with a clear reason (kernels stay importable)."""
    try:
        import cupy  # noqa: F401
        from cupy.cuda import runtime
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError("the PLE GPU path needs CuPy (pip install cupy-cuda12x/13x)") from exc
    return runtime


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        return cupy_runtime().getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means "no usable GPU here"
        return False


@dataclass(frozen=True)
class HostAccess:
    """What the device can do with host memory; decides the PleTable mode."""

    device: int
    name: str
    pageable_memory_access: bool
    uses_host_page_tables: bool
    host_register_supported: bool
    read_only_register_supported: bool
    host_pointer_for_registered_mem: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def host_access(device: int | None = None) -> HostAccess:
    rt = cupy_runtime()
    dev = rt.getDevice() if device is None else device

    def attr(a: int) -> bool:
        try:
            return bool(rt.deviceGetAttribute(a, dev))
        except Exception:  # noqa: BLE001 - an attribute unknown to an old driver reads as 0
            return False

    props = rt.getDeviceProperties(dev)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return HostAccess(
        device=dev,
        name=name,
        pageable_memory_access=attr(ATTR_PAGEABLE_MEMORY_ACCESS),
        uses_host_page_tables=attr(ATTR_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES),
        host_register_supported=attr(ATTR_HOST_REGISTER_SUPPORTED),
        read_only_register_supported=attr(ATTR_READ_ONLY_HOST_REGISTER_SUPPORTED),
        host_pointer_for_registered_mem=attr(ATTR_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM),
    )


def host_register(ptr: int, size: int, *, read_only: bool) -> None:
    flags = HOST_REGISTER_MAPPED | (HOST_REGISTER_READ_ONLY if read_only else 0)
    cupy_runtime().hostRegister(ptr, size, flags)


def host_unregister(ptr: int) -> None:
    cupy_runtime().hostUnregister(ptr)


@functools.lru_cache(maxsize=1)
def _libcuda() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuMemHostGetDevicePointer_v2
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    u = ctypes.c_uint
    lib.cuLaunchKernel.argtypes = [
        ctypes.c_void_p,
        u,
        u,
        u,
        u,
        u,
        u,
        u,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    lib.cuLaunchKernel.restype = ctypes.c_int
    return lib


class PackedArgs:
    """Kernel parameters as the `void**` array cuLaunchKernel takes, built once.

    `values` are ctypes scalars of exactly the kernel parameter types (c_uint64 for pointers).
    """

    def __init__(self, values: list[ctypes._SimpleCData]) -> None:
        self.values = values  # kept alive: the array points into them
        self.array = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        self.ptr = ctypes.addressof(self.array)


def launch_kernel(func: int, grid: int, block: int, args: PackedArgs, stream: int) -> None:
    """cuLaunchKernel on a 1-D grid; `func` is a CUfunction (CuPy's `Function.ptr`)."""
    rc = _libcuda().cuLaunchKernel(func, grid, 1, 1, block, 1, 1, 0, stream, args.ptr, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernel failed with CUresult {rc}")


def host_get_device_pointer(ptr: int) -> int:
    """Device address of registered host memory (driver API; CuPy does not wrap it)."""
    out = ctypes.c_uint64(0)
    rc = _libcuda().cuMemHostGetDevicePointer_v2(ctypes.byref(out), ctypes.c_void_p(ptr), 0)
    if rc != 0:
        raise RuntimeError(f"cuMemHostGetDevicePointer failed with CUresult {rc}")
    return int(out.value)
