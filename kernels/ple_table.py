"""`PleTable`: the host-resident PLE table, made readable by the GPU where it lies.

The table (`per_layer_token_embd.weight`, 26.8 GiB in the real model) is mapped read-only from the
GGUF and never copied whole. How the GPU reads it depends on the device, and the chosen mode is
reported with the reason (`PleTable.mode`, `.mode_reason`, `.describe()`):

- `pageable`: the device dereferences ordinary host memory (`cudaDevAttrPageableMemoryAccess` = 1:
  GB10/Grace over NVLink-C2C with ATS, or HMM). The kernel gets the mmap address as is; pages stay
  lazily backed by the page cache, exactly as llama.cpp's lazy mode keeps them.
- `registered`: otherwise the mapped range is `cudaHostRegister`-ed (mapped + read-only) and the
  kernel reads it over PCIe in place; host-row gathers above `stage_above_rows` (prefill batches)
  take the staged path, which is faster there. Registration pins every page of the range, so it
  is refused above `max_register_fraction` of the RAM available now, with the figures in the message.
- `staged`: the fallback: the CPU gathers the raw rows into a pinned buffer, one async copy moves
  them, and the same dequant kernel runs on the compact rows (7x fewer bytes than copying the
  float32 result for 160-value IQ4_NL rows).

Row indices outside the table are an error: host indices are checked before any launch; device
indices are checked in the kernel, which reads nothing out of range and records the offence for
`raise_on_bad_rows()`.
"""

from __future__ import annotations

import logging
import mmap
from typing import Any, Literal

import numpy as np

from . import cudart
from .cuda_kernels import GatherLaunch, as_stream
from .dequant import check_rows
from .gguf_tensor import TableLocation

log = logging.getLogger(__name__)

Mode = Literal["pageable", "registered", "staged"]
MODES: tuple[Mode, ...] = ("pageable", "registered", "staged")

# In `registered` mode, host-side gathers of more rows than this take the staged path. Over PCIe
# the GPU's random 90-byte reads of a large registered table are bound by GPU TLB misses on 4 KiB
# host pages, so staging the raw rows wins for prefill-sized gathers and ties for a token's
# (docs/results/ple.md, `benchmarks/ple_gather.py`). Decode-sized gathers (up to 4 tokens x 16
# heads) stay in place.
# Pageable mode (GB10) never stages: there the table is in the GPU's own memory.
STAGE_ABOVE_ROWS = 64


class PleTableError(RuntimeError):
    """A requested mode cannot be used here; the message says why."""


def mem_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (what could be pinned without evicting the system)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("MemAvailable not found in /proc/meminfo")


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


class PleTable:
    """A GGUF tensor mapped read-only and exposed to one CUDA device in place."""

    def __init__(
        self,
        loc: TableLocation,
        *,
        mode: Mode | Literal["auto"] = "auto",
        max_register_fraction: float = 0.5,
        stage_above_rows: int | None = STAGE_ABOVE_ROWS,
        device: int | None = None,
    ) -> None:
        import cupy

        self.loc = loc
        self.stage_above_rows = stage_above_rows
        self.ggml_type, self.row_dim, self.n_rows = loc.ggml_type, loc.row_dim, loc.n_rows
        self.row_bytes = loc.row_bytes
        self.max_register_fraction = max_register_fraction
        self._registered_base: int | None = None
        self._mm: mmap.mmap | None = None
        self._device = cupy.cuda.Device(device if device is not None else cupy.cuda.Device().id)
        self.access = cudart.host_access(self._device.id)

        page = mmap.ALLOCATIONGRANULARITY
        start = loc.offset - loc.offset % page
        self._delta = loc.offset - start
        self._map_len = self._delta + loc.nbytes
        with open(loc.path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), self._map_len, access=mmap.ACCESS_READ, offset=start)
        self._host: np.ndarray | None = np.frombuffer(
            self._mm, dtype=np.uint8, count=loc.nbytes, offset=self._delta
        ).reshape(self.n_rows, self.row_bytes)
        self.host_ptr = int(self._host.ctypes.data)
        self._map_base = self.host_ptr - self._delta

        with self._device:
            self.mode, self.mode_reason = self._choose(mode)
            try:
                self.device_ptr = self._enable(self.mode)
            except Exception as exc:  # noqa: BLE001 - CUDA reports refusals as various errors
                if self.mode != "registered":
                    raise
                if mode == "registered":
                    self.close()
                    raise PleTableError(f"registered mode failed: cudaHostRegister: {exc}") from exc
                log.warning("PLE table falls back to staged copies: cudaHostRegister failed: %s", exc)
                self.mode, self.mode_reason = "staged", f"cudaHostRegister failed: {exc}"
                self.device_ptr = self._enable(self.mode)
            self._err = cupy.zeros(3, dtype=np.int32)
            self._idx_pinned: np.ndarray | None = None
            self._raw_pinned: np.ndarray | None = None
            self._raw_dev: Any = None
            self._staging_done = cupy.cuda.Event(disable_timing=True)
            self._staging_done.record()
        log.info(
            "PLE table %s: %s, %.2f GiB, mode %s (%s)",
            loc.path.name,
            loc.type_name,
            loc.nbytes / 2**30,
            self.mode,
            self.mode_reason,
        )

    # -- mode selection ----------------------------------------------------------------------
    def _register_refusal(self) -> str | None:
        a = self.access
        if not a.host_register_supported:
            return "the device does not support cudaHostRegister"
        if not a.read_only_register_supported:
            return "the device cannot register read-only (mmap'd) memory"
        avail = mem_available_bytes()
        limit = int(avail * self.max_register_fraction)
        if self._map_len > limit:
            return (
                f"pinning {_size(self._map_len)} would exceed max_register_fraction="
                f"{self.max_register_fraction:g} of the {_size(avail)} RAM available "
                f"(limit {_size(limit)})"
            )
        return None

    def _choose(self, mode: str) -> tuple[Mode, str]:
        a = self.access
        pageable_why = (
            "device reads pageable host memory (cudaDevAttrPageableMemoryAccess=1"
            f"{', host page tables' if a.uses_host_page_tables else ''})"
        )
        if mode == "pageable":
            if not a.pageable_memory_access:
                raise PleTableError(
                    f"pageable mode unavailable: {a.name} reports cudaDevAttrPageableMemoryAccess=0"
                )
            return "pageable", pageable_why
        if mode == "registered":
            refusal = self._register_refusal()
            if refusal:
                raise PleTableError(f"registered mode refused: {refusal}")
            return "registered", "requested"
        if mode == "staged":
            return "staged", "requested"
        if mode != "auto":
            raise ValueError(f"mode must be one of {MODES + ('auto',)}, got {mode!r}")
        if a.pageable_memory_access:
            return "pageable", pageable_why
        refusal = self._register_refusal()
        if refusal is None:
            return "registered", "no pageable memory access; mapped range registered read-only"
        log.warning("PLE table falls back to staged copies: %s", refusal)
        return "staged", f"registration refused: {refusal}"

    def _enable(self, mode: Mode) -> int:
        assert self._mm is not None  # mapped in __init__, before any mode is enabled
        if mode == "pageable":
            self._mm.madvise(mmap.MADV_RANDOM)
            return self.host_ptr
        if mode == "staged":
            self._mm.madvise(mmap.MADV_RANDOM)
            return 0
        length = -(-self._map_len // mmap.PAGESIZE) * mmap.PAGESIZE
        self._mm.madvise(mmap.MADV_WILLNEED)
        cudart.host_register(self._map_base, length, read_only=True)
        self._registered_base = self._map_base
        if self.access.host_pointer_for_registered_mem:
            return self.host_ptr
        return cudart.host_get_device_pointer(self.host_ptr)

    # -- gathering ---------------------------------------------------------------------------
    @property
    def host(self) -> np.ndarray:
        """The table as read-only uint8 [n_rows, row_bytes] (the reference reads it here)."""
        if self._host is None:
            raise ValueError("PleTable is closed")
        return self._host

    def describe(self) -> dict[str, Any]:
        return {
            "path": str(self.loc.path),
            "tensor": self.loc.name,
            "type": self.loc.type_name,
            "row_dim": self.row_dim,
            "n_rows": self.n_rows,
            "bytes": self.loc.nbytes,
            "mode": self.mode,
            "mode_reason": self.mode_reason,
            "access": self.access.as_dict(),
            "stage_above_rows": self.stage_above_rows if self.mode == "registered" else None,
        }

    def _stages(self, n_out: int) -> bool:
        if self.mode == "staged":
            return True
        return (
            self.mode == "registered" and self.stage_above_rows is not None and n_out > self.stage_above_rows
        )

    def _grow(self, n_rows_out: int, staged: bool) -> np.ndarray:
        """The pinned buffer a gather of `n_rows_out` rows uses, grown to fit: the raw rows when
        `staged` (with their device copy in `_raw_dev`), the row ids otherwise."""
        import cupy
        import cupyx

        if staged:
            if self._raw_pinned is None or self._raw_pinned.shape[0] < n_rows_out:
                self._raw_pinned = cupyx.empty_pinned((n_rows_out, self.row_bytes), dtype=np.uint8)
                self._raw_dev = cupy.empty((n_rows_out, self.row_bytes), dtype=np.uint8)
            return self._raw_pinned
        if self._idx_pinned is None or self._idx_pinned.size < n_rows_out:
            self._idx_pinned = cupyx.empty_pinned(max(n_rows_out, 64), dtype=np.int32)
        return self._idx_pinned

    def gather(self, rows: Any, out: Any, *, stream: Any = None) -> None:
        """Gather + dequantize `rows` [n_tokens, n_heads] into float32 `out` [n_tokens, n_heads*row_dim].

        `rows` may be a numpy array (checked here, then written to a pinned buffer that the kernel
        reads directly: no copy node) or a device int32 array (checked in the kernel).
        Asynchronous on `stream` (raw handle, CuPy stream or None for the current one), except
        that host rows first wait for the previous host-row call so the pinned buffers can be reused.
        """
        import cupy

        if self._host is None:
            raise ValueError("PleTable is closed")
        on_device = isinstance(rows, cupy.ndarray)
        n_out = int(rows.size)
        if out.dtype != np.float32 or out.size != n_out * self.row_dim or not out.flags.c_contiguous:
            raise ValueError(f"out must be contiguous float32 with {n_out * self.row_dim} values")
        with self._device:
            strm = as_stream(stream)
            if self.mode == "staged" and on_device:  # (registered mode reads device rows in place)
                log.debug("staged PLE gather pulls device rows back to the host (synchronizes)")
                rows, on_device = rows.get(stream=strm), False
            if on_device:
                if rows.dtype != np.int32 or not rows.flags.c_contiguous:
                    raise ValueError("device rows must be contiguous int32")
                GatherLaunch(
                    self.device_ptr, self.n_rows, self.ggml_type, self.row_dim, rows, n_out, out, self._err
                )(strm)
                return
            idx = check_rows(rows, self.n_rows).reshape(-1)
            self._staging_done.synchronize()  # the previous reads of the pinned buffers are done
            staged = self._stages(n_out)
            pinned = self._grow(n_out, staged)
            if staged:
                np.take(self._host, idx, axis=0, out=pinned[:n_out])
                cupy.cuda.runtime.memcpyAsync(
                    self._raw_dev.data.ptr, pinned.ctypes.data, n_out * self.row_bytes, 1, strm.ptr
                )
                GatherLaunch(
                    self._raw_dev.data.ptr, n_out, self.ggml_type, self.row_dim, None, n_out, out, self._err
                )(strm)
            else:
                pinned[:n_out] = idx  # pinned host memory is device-readable (UVA)
                GatherLaunch(
                    self.device_ptr,
                    self.n_rows,
                    self.ggml_type,
                    self.row_dim,
                    pinned.ctypes.data,
                    n_out,
                    out,
                    self._err,
                )(strm)
            self._staging_done.record(strm)

    def raise_on_bad_rows(self, stream: Any = None) -> None:
        """Synchronize `stream` and raise IndexError if a device-side index was out of range."""

        with self._device:
            strm = as_stream(stream)
            strm.synchronize()
            flag, out_row, bad = (int(x) for x in self._err.get())
            if flag:
                self._err.fill(0)
                raise IndexError(
                    f"row index {bad} (output row {out_row}) outside the table of "
                    f"{self.n_rows} rows; nothing was read for it"
                )

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Unregister (if registered) and unmap. Views obtained from `.host` must be dropped first."""
        if self._registered_base is not None:
            with self._device:
                self._device.synchronize()
                cudart.host_unregister(self._registered_base)
            self._registered_base = None
        self._host = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                log.warning("PLE table mapping still referenced; it is unmapped when released")
            self._mm = None

    def __enter__(self) -> PleTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_registered_base", None) is not None:
            log.warning("PleTable was not closed; unregistering at garbage collection")
            try:
                self.close()
            except Exception:  # noqa: BLE001 - the CUDA context may already be gone
                log.debug("unregistering at garbage collection failed", exc_info=True)
