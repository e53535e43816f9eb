"""The PLE rows of a qwen4exp model gathered on the GPU, on llama.cpp's CUDA stream.

llama.cpp (with packaging/patches/ple-provider.patch) calls a registered provider once per
ubatch with the hashed row ids and a GPU destination; the provider launches `kernels/`'s gather +
dequantize on llama.cpp's CUDA stream and returns. The token-embedding table goes to the GPU with
a tensor override, so the decode step loses its CPU split for the input embeddings (docs/ple.md).

`plan()` decides before the load whether the model runs this way (`ple_gather` in the profile),
`PleProvider` registers the callback on a loaded model. Decode-sized gathers run in C: the patch's
`ggml_backend_cuda_ple_launch` launches our compiled kernel itself (`NativeLauncher`), so a decode
step calls no Python; larger gathers (prefill) call back into `PleProvider._gather`. Anything
that fails says why in one log line, and the model runs llama.cpp's stock CPU gather.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...kernels.dequant import check_rows
from ...kernels.gguf_tensor import TableLocation, table_location
from .gguf_file import GGUFHeader, read_header

log = logging.getLogger(__name__)

PLE_TENSOR = "per_layer_token_embd.weight"
TOKEN_EMBD_PATTERN = b"^token_embd\\.weight$"


class PleGatherArgs(ctypes.Structure):
    """`struct llama_ple_gather_args` of the patched llama.h."""

    _fields_ = [
        ("dst", ctypes.c_void_p),
        ("rows", ctypes.POINTER(ctypes.c_int32)),
        ("n_idx", ctypes.c_int64),
        ("tokens", ctypes.POINTER(ctypes.c_int32)),
        ("n_tokens", ctypes.c_int32),
        ("n_heads", ctypes.c_int32),
        ("row_dim", ctypes.c_int64),
        ("table", ctypes.c_void_p),
        ("n_table_rows", ctypes.c_int64),
        ("row_stride", ctypes.c_size_t),
        ("type", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
    ]


PROVIDER_FN = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.POINTER(PleGatherArgs), ctypes.c_void_p)


class NativeLauncher(ctypes.Structure):
    """`struct ggml_cuda_ple_launcher` of the patch's ggml-cuda/ple-launch.cuh: the state of the
    C provider, filled once here and read and updated by ggml-cuda on every decode step."""

    _fields_ = [
        ("func", ctypes.c_void_p),
        ("table", ctypes.c_void_p),
        ("n_table_rows", ctypes.c_int64),
        ("row_bytes", ctypes.c_int64),
        ("row_dim", ctypes.c_int32),
        ("type", ctypes.c_int32),
        ("rows", ctypes.c_void_p),
        ("capacity", ctypes.c_int64),
        ("err", ctypes.c_void_p),
        ("done", ctypes.c_void_p),
        ("block", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("bad_index", ctypes.c_int64),
        ("bad_row", ctypes.c_int64),
        ("launches", ctypes.c_int64),
        ("fallbacks", ctypes.c_int64),
        ("status", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("fallback", PROVIDER_FN),
        ("fallback_ud", ctypes.c_void_p),
    ]


NATIVE_STATUS = {1: "cudaEventSynchronize", 2: "cuLaunchKernel", 3: "cudaEventRecord"}


class BuftOverride(ctypes.Structure):
    """`struct llama_model_tensor_buft_override` (llama-cpp-python leaves the field untyped)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _llama_lib() -> ctypes.CDLL:
    from llama_cpp import llama_cpp as ll

    return ll._lib


def provider_symbol() -> Callable[..., None] | None:
    """`llama_model_set_ple_provider` of the loaded libllama, or None (an unpatched build)."""
    try:
        fn = _llama_lib().llama_model_set_ple_provider
    except AttributeError:
        return None
    fn.argtypes = [ctypes.c_void_p, PROVIDER_FN, ctypes.c_void_p]
    fn.restype = None
    return fn


def _ggml() -> ctypes.CDLL:
    """libggml next to libllama (already loaded with it: this opens the same handle)."""
    lib = Path(_llama_lib()._name).parent / "libggml.so"
    g = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    g.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    g.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    g.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    g.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    g.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    g.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    g.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    g.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    g.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    g.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    return g


def native_launch_address() -> int | None:
    """The address of the patch's C provider `ggml_backend_cuda_ple_launch`, or None (no CUDA
    backend, or a build from before it existed)."""
    try:
        g = _ggml()
    except OSError:
        return None
    reg = g.ggml_backend_reg_by_name(b"CUDA")
    if not reg:
        return None
    return g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_cuda_ple_launch") or None


def cuda_buffer_type() -> int | None:
    """The first CUDA device's buffer type, or None when the build has no CUDA backend."""
    try:
        g = _ggml()
    except OSError:
        return None
    reg = g.ggml_backend_reg_by_name(b"CUDA")
    if not reg or g.ggml_backend_reg_dev_count(reg) == 0:
        return None
    return g.ggml_backend_dev_buffer_type(g.ggml_backend_reg_dev_get(reg, 0)) or None


@dataclass(frozen=True)
class PlePlan:
    """What `ple_gather` resolved to before the load: "gpu" or "stock", and why."""

    mode: str
    reason: str
    buft: int | None = None  # the CUDA buffer type for the token-embedding override


def locate_tensor(path: str | Path, name: str = PLE_TENSOR) -> TableLocation:
    """Where tensor `name`'s bytes lie in the GGUF at `path`: its header read here, the facts
    handed to `kernels/` (raises KeyError for a missing tensor, ValueError for a type the
    kernels do not decode)."""
    header = read_header(Path(path))
    info = header.tensor(name)
    if info is None:
        raise KeyError(f"{path}: no tensor named {name!r}")
    return table_location(path, name, info.ggml_type, info.shape, header.data_offset + info.offset)


def ple_layer(header: GGUFHeader) -> int | None:
    layers = header.metadata.get(f"{header.architecture}.ple.layers")
    if isinstance(layers, (list, tuple)) and layers:
        return int(layers[0])
    return None


def plan(setting: str, header: GGUFHeader, n_gpu_layers: int) -> PlePlan:
    """Resolve `ple_gather` ("auto", "gpu" or "stock") for this model before it is loaded."""
    if header.tensor(PLE_TENSOR) is None:
        return PlePlan("stock", "the model has no PLE table")
    if setting == "stock":
        return PlePlan("stock", "ple_gather = stock")
    why, buft = _gpu_refusal(header, n_gpu_layers)
    if why is None:
        return PlePlan("gpu", f"ple_gather = {setting}: CUDA build, CuPy, PLE layer on the GPU", buft)
    if setting == "gpu":
        log.warning("PLE gather on the GPU unavailable, running stock: %s", why)
    return PlePlan("stock", why)


def _gpu_refusal(header: GGUFHeader, n_gpu_layers: int) -> tuple[str | None, int | None]:
    if n_gpu_layers == 0:
        return "no layers on the GPU (n_gpu_layers = 0)", None
    if provider_symbol() is None:
        return "this llama.cpp build lacks llama_model_set_ple_provider (unpatched)", None
    buft = cuda_buffer_type()
    if buft is None:
        return "this llama.cpp build has no CUDA device", None
    n_layer = int(header.metadata.get(f"{header.architecture}.block_count", 0))
    il = ple_layer(header)
    if n_gpu_layers > 0 and il is not None and il < n_layer - n_gpu_layers:
        return f"the PLE layer {il} stays on the CPU (n_gpu_layers = {n_gpu_layers} of {n_layer})", None
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device", None
    except Exception as exc:  # noqa: BLE001 - ImportError or a CUDA error: either way no CuPy
        return f"CuPy is unusable here ({type(exc).__name__}: {exc})", None
    return None, buft


def token_embd_override(buft: int) -> ctypes.Array[BuftOverride]:
    """The NULL-terminated override list that puts `token_embd.weight` on the CUDA device;
    keep it alive while the model loads."""
    arr = (BuftOverride * 2)()
    arr[0].pattern = TOKEN_EMBD_PATTERN
    arr[0].buft = buft
    return arr


class PleProvider:
    """The registered callback: `PleTable` gathers into llama.cpp's input tensor on its stream.

    Decode-sized gathers keep one prepared kernel launch per destination (llama.cpp keeps the
    tensor's address while it reuses the graph), reading the row ids from a pinned buffer; larger
    ones go through `PleTable.gather` (which stages them in registered mode). A failure is kept
    in `error` and the destination zeroed; the engine raises it after the decode (a turn error,
    never an abort inside llama.cpp).
    """

    MAX_PREPARED = 8
    NATIVE_CAPACITY = 4096  # row ids per C-side gather (pinned int32); larger ones call back
    NATIVE = True  # decode gathers in C when the build has it (False: every gather calls Python)

    def __init__(self, model_path: Path, model_ptr: Any, native: bool | None = None) -> None:
        from ...kernels.ple_table import PleTable

        self.table = PleTable(locate_tensor(model_path))
        self._warm_up()
        self._error: str | None = None
        self.calls = 0
        self.busy_s = 0.0  # time spent in the callback (its Python and launch overhead)
        self.unordered_calls = 0  # calls without a stream from llama.cpp (each synchronizes)
        self._prepared: dict[tuple[int, int, int], Any] = {}
        self._streams: dict[int, Any] = {}
        set_provider = provider_symbol()
        if set_provider is None:
            raise RuntimeError("this llama.cpp build lacks llama_model_set_ple_provider (unpatched)")
        self._set = set_provider
        self._model = model_ptr
        self._cb = PROVIDER_FN(self._gather)
        self.native: NativeLauncher | None = None
        self.native_reason = "off (native = False)"
        self._native_keep: tuple[Any, ...] = ()
        if self.NATIVE if native is None else native:
            self.native_reason = self._native_setup()
        if self.native is not None:
            self._set(model_ptr, PROVIDER_FN(self._native_fn), ctypes.addressof(self.native))
        else:
            self._set(model_ptr, self._cb, None)

    def _native_setup(self) -> str:
        """Fill the C provider's state; returns why it is used or not (for the log and doctor)."""
        addr = native_launch_address()
        if addr is None:
            return "this build has no ggml_backend_cuda_ple_launch"
        t = self.table
        if t.mode == "staged":
            return "the table is staged (no device-readable address)"
        import cupy
        import cupyx

        from ...kernels.cuda_kernels import BLOCK, ggml_type_id, kernel

        cap = self.NATIVE_CAPACITY
        if t.mode == "registered" and t.stage_above_rows is not None:
            cap = min(cap, t.stage_above_rows)  # larger gathers over PCIe are staged in Python
        with t._device:
            rows = cupyx.empty_pinned(cap, dtype=np.int32)
            err = cupy.zeros(3, dtype=np.int32)
            done = cupy.cuda.Event(disable_timing=True)
            func = int(kernel("ple_gather_dequant").kernel.ptr)
            device = cupy.cuda.Device().id
        n = NativeLauncher()
        n.func, n.table, n.n_table_rows = func, t.device_ptr, t.n_rows
        n.row_bytes, n.row_dim, n.type = t.row_bytes, t.row_dim, ggml_type_id(t.ggml_type)
        n.rows, n.capacity, n.err, n.done = rows.ctypes.data, cap, int(err.data.ptr), int(done.ptr)
        n.block, n.device, n.bad_index, n.bad_row = BLOCK, device, -1, 0
        n.fallback, n.fallback_ud = self._cb, None
        self._native_fn = addr
        self._native_keep = (rows, err, done)
        self.native = n
        return f"C launch for gathers up to {cap} rows"

    @property
    def error(self) -> str | None:
        """The first failure since the last `take_error` (checked by the engine after each decode)."""
        n = self.native
        if self._error is None and n is not None and (n.bad_index >= 0 or n.status):
            if n.bad_index >= 0:
                self._error = (
                    f"PLE gather failed: row index {n.bad_row} outside the table of {n.n_table_rows} rows"
                )
            else:
                self._error = f"PLE gather failed: {NATIVE_STATUS.get(n.status, n.status)} failed"
            n.bad_index, n.status = -1, 0
            log.error("%s", self._error)
        return self._error

    @error.setter
    def error(self, value: str | None) -> None:
        self._error = value

    @property
    def launches(self) -> int:
        """Gathers done so far: Python calls plus C launches."""
        return self.calls + (self.native.launches if self.native is not None else 0)

    def _warm_up(self) -> None:
        """One gather now, so the kernel is compiled and loaded before the first prefill."""
        import cupy

        out = cupy.empty(self.table.row_dim, dtype=np.float32)
        self.table.gather(np.zeros((1, 1), dtype=np.int32), out)
        cupy.cuda.get_current_stream().synchronize()

    def describe(self) -> str:
        t = self.table
        return (
            f"{t.loc.type_name} table {t.n_rows} rows x {t.row_dim}, {t.mode} ({t.mode_reason}); "
            f"decode gathers: {self.native_reason}"
        )

    def take_error(self) -> str | None:
        err, self._error = self.error, None
        return err

    def _stream(self, handle: int) -> Any:
        s = self._streams.get(handle)
        if s is None:
            from ...kernels.cuda_kernels import as_stream

            s = self._streams[handle] = as_stream(handle)
        return s

    def _gather(self, p: Any, _ud: Any) -> bool:
        t0 = time.perf_counter()
        a = p.contents
        try:
            self.calls += 1
            n, dim = int(a.n_idx), int(a.row_dim)
            if dim != self.table.row_dim or a.n_table_rows != self.table.n_rows:
                raise ValueError(
                    f"llama.cpp's PLE table ({a.n_table_rows} x {dim}) is not the one mapped "
                    f"({self.table.n_rows} x {self.table.row_dim})"
                )
            rows = self._rows(a)
            stream = self._stream(int(a.stream or 0))
            if self.table._stages(n):
                self.table.gather(
                    rows.reshape(a.n_tokens, a.n_heads), self._out(a.dst, n * dim), stream=stream
                )
            else:
                self._launch(rows, int(a.dst), n, stream)
            if not a.stream:
                self.unordered_calls += 1
                stream.synchronize()  # no stream from llama.cpp: finish before returning
        except Exception as exc:  # noqa: BLE001 - never raise into C
            if self._error is None:
                self._error = f"PLE gather failed: {exc}"
                log.error("%s", self._error)
            try:
                import cupy

                self._out(a.dst, int(a.n_idx) * int(a.row_dim)).fill(0)
                cupy.cuda.runtime.deviceSynchronize()
            except Exception:  # noqa: BLE001
                log.debug("zeroing the PLE destination failed", exc_info=True)
        self.busy_s += time.perf_counter() - t0
        return True

    def _rows(self, a: PleGatherArgs) -> np.ndarray:
        """The row ids llama.cpp hashed (its memory, valid during the call only)."""
        return np.ctypeslib.as_array(a.rows, shape=(int(a.n_idx),))

    def _out(self, dst: int, n_values: int) -> Any:
        import cupy

        mem = cupy.cuda.UnownedMemory(int(dst), n_values * 4, self)
        return cupy.ndarray((n_values,), dtype=np.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def _launch(self, rows: np.ndarray, dst: int, n: int, stream: Any) -> None:
        """In place: row ids checked here, copied to a pinned buffer, one prepared kernel."""
        t = self.table
        key = (dst, n, int(stream.ptr))
        prep = self._prepared.get(key)
        if prep is None:
            import cupy
            import cupyx

            from ...kernels.cuda_kernels import GatherLaunch

            if len(self._prepared) >= self.MAX_PREPARED:
                for old in self._prepared.values():
                    old[2].synchronize()
                self._prepared.clear()
            with t._device:
                idx = cupyx.empty_pinned(n, dtype=np.int32)
                err = cupy.zeros(3, dtype=np.int32)
                launch = GatherLaunch(
                    t.device_ptr, t.n_rows, t.ggml_type, t.row_dim, idx.ctypes.data, n, dst, err
                )
                done = cupy.cuda.Event(disable_timing=True)
            prep = self._prepared[key] = (idx, launch, done, err)
        idx, launch, done, _err = prep
        done.synchronize()  # the previous launch has read the pinned row ids
        idx[:] = check_rows(rows, t.n_rows)
        launch(int(stream.ptr))
        done.record(stream)

    def close(self) -> None:
        """Unregister (the model must not call back any more) and release the table."""
        if self._model:
            self._set(self._model, PROVIDER_FN(), None)
            self._model = None
        for _idx, _launch, done, _err in self._prepared.values():
            done.synchronize()
        self._prepared.clear()
        if self._native_keep:
            self._native_keep[2].synchronize()  # the last C launch has read its row buffer
            self._native_keep = ()
            self.native = None
        self.table.close()
