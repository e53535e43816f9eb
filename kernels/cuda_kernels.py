"""CuPy kernels for the PLE path: the n-gram hash and one fused gather + dequantize.

Both launch on a caller-given stream (a raw `cudaStream_t` wrapped by `cupy.cuda.ExternalStream`,
so llama.cpp's own stream can be used later) and write into caller-given device buffers; neither
synchronizes. The gather reads the table through whatever address the caller passes: a device
buffer, registered host memory, or plain host memory on a GPU with pageable memory access (GB10).

Why one thread per output value: the per-token case (16 rows of 160 values) is latency-bound, so
the point is to have every load in flight at once; a warp covers one 32-value quant block, so its
reads of the block's scale and quants merge into one request. Every product is exact in float32
(see dequant.py), so the results are bit-identical to ggml's CPU `get_rows`.

Rows outside the table are never read: the kernel writes NaN there and records the first offence
in an int32[3] error word (flag, output row, bad index) that `PleTable` checks.
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from typing import Any

import numpy as np

from .cudart import PackedArgs, launch_kernel
from .dequant import ggml_type_id, row_nbytes
from .ple_hash import PleHashSpec

BLOCK = 256

CUDA_SOURCE = r"""
__constant__ float kvalues_iq4nl[16] = {
    -127.f, -104.f, -83.f, -65.f, -49.f, -35.f, -22.f, -10.f,
    1.f, 13.f, 25.f, 38.f, 53.f, 69.f, 89.f, 113.f};

__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

extern "C" __global__ void ple_gather_dequant(
        const unsigned char * __restrict__ table, long long n_table_rows, long long row_bytes,
        int row_dim, int ggml_type, const int * __restrict__ rows, long long n_out_rows,
        float * __restrict__ out, int * __restrict__ err) {
    const long long total = n_out_rows * row_dim;
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long) gridDim.x * blockDim.x) {
        const long long o = i / row_dim;
        const int c = (int) (i - o * row_dim);
        const long long r = rows ? (long long) rows[o] : o;
        if (r < 0 || r >= n_table_rows) {
            if (atomicCAS(err, 0, 1) == 0) { err[1] = (int) o; err[2] = (int) r; }
            out[i] = __int_as_float(0x7fc00000);
            continue;
        }
        const unsigned char * src = table + r * row_bytes;
        float v;
        switch (ggml_type) {
            case 0:  // F32: copy the bits
                v = __int_as_float(((const int *) src)[c]);
                break;
            case 1:  // F16
                v = f16_to_f32(((const unsigned short *) src)[c]);
                break;
            case 30: // BF16
                v = __int_as_float(((int) ((const unsigned short *) src)[c]) << 16);
                break;
            case 8: {  // Q8_0: 34-byte blocks {f16 d; int8 qs[32]}
                const unsigned char * b = src + (c >> 5) * 34;
                const float d = f16_to_f32(*(const unsigned short *) b);
                v = (float) ((const signed char *) b)[2 + (c & 31)] * d;
                break;
            }
            default: { // 20 IQ4_NL: 18-byte blocks {f16 d; uint8 qs[16]}, low nibbles first
                const unsigned char * b = src + (c >> 5) * 18;
                const float d = f16_to_f32(*(const unsigned short *) b);
                const int j = c & 31;
                const unsigned char q = b[2 + (j & 15)];
                v = d * kvalues_iq4nl[j < 16 ? (q & 15) : (q >> 4)];
                break;
            }
        }
        out[i] = v;
    }
}

// One (token, head): the window with EOS reset, uint64 mixing, % vocab + offset.
// q[-s] is predecessor s (s = 1 nearest); s > limit means "before the sequence start".
__device__ __forceinline__ int ple_row(
        long long tok, const int * q, long long limit, int h, int per_gram, long long eos,
        const unsigned long long * mult, const unsigned int * offs, const unsigned int * vocab) {
    const int n = h / per_gram + 2;
    unsigned long long mixed = (unsigned long long) tok * mult[0];
    bool cut = false;
    for (int s = 1; s < n; ++s) {
        const long long t = (cut || s > limit) ? -1 : (long long) q[-s];
        cut = cut || t < 0 || t == eos;
        mixed ^= (unsigned long long) (cut ? eos : t) * mult[s];
    }
    return (int) (mixed % vocab[h] + offs[h]);
}

// prev != NULL: tok holds the batch's tokens [n_tokens] and prev their predecessors
//   [n_tokens, n_prev], oldest-first, negative = missing (llama.cpp's get_prev_tokens layout);
// prev == NULL: tok holds one sequence from its start [n_hist + n_tokens]; its last n_tokens are hashed.
extern "C" __global__ void ple_hash(
        const int * __restrict__ tok, const int * __restrict__ prev, long long n_hist,
        long long n_tokens, int n_prev, int n_heads, int per_gram, long long eos,
        const unsigned long long * __restrict__ mult, const unsigned int * __restrict__ offs,
        const unsigned int * __restrict__ vocab, int * __restrict__ rows) {
    const long long k = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n_tokens * n_heads) return;
    const long long i = k / n_heads;
    const int h = (int) (k - i * n_heads);
    if (prev) {
        rows[k] = ple_row(tok[i], prev + i * n_prev + n_prev, n_prev, h, per_gram, eos, mult, offs, vocab);
    } else {
        const long long pos = n_hist + i;
        rows[k] = ple_row(tok[pos], tok + pos, pos, h, per_gram, eos, mult, offs, vocab);
    }
}

// A stand-in for the model's first consumer of ple_embd (benchmark only): per-block weighted sums.
extern "C" __global__ void dummy_consumer(const float * __restrict__ x, long long n, float * __restrict__ y) {
    __shared__ float acc[256];
    float s = 0.f;
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long) gridDim.x * blockDim.x) {
        s += x[i] * (float) ((i & 7) + 1);
    }
    acc[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[blockIdx.x] = acc[0];
}
"""


@functools.cache
def _module(device: int) -> Any:
    import cupy

    with cupy.cuda.Device(device):
        mod = cupy.RawModule(code=CUDA_SOURCE, options=("--std=c++14",))
        mod.compile()
    return mod


def kernel(name: str) -> Any:
    """A compiled kernel of CUDA_SOURCE on the current device (compiled once per device)."""
    import cupy

    return _module(cupy.cuda.Device().id).get_function(name)


class _StreamHandle:
    """A raw cudaStream_t presented through the CUDA stream protocol (CuPy's from_external)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def as_stream(stream: Any) -> Any:
    """Accept a raw cudaStream_t (int), a CuPy stream, or None (the current stream)."""
    import cupy

    if stream is None:
        return cupy.cuda.get_current_stream()
    if isinstance(stream, int):
        try:  # CuPy 14 deprecates ExternalStream in favour of the stream protocol
            return cupy.cuda.Stream.from_external(_StreamHandle(stream))
        except (AttributeError, TypeError, ValueError):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return cupy.cuda.ExternalStream(stream)
    return stream


def stream_ptr(stream: Any) -> int:
    """The raw cudaStream_t of a raw handle, a CuPy stream, or None (the current stream)."""
    if isinstance(stream, int):
        return stream
    return int(as_stream(stream).ptr)


def _ptr(buf: Any) -> int:
    """Device address of a CuPy array, or an address given as an int."""
    return int(buf) if isinstance(buf, (int, np.integer)) else int(buf.data.ptr)


class _Launch:
    """A kernel launch with its arguments packed once; calling it launches on a stream."""

    def __init__(self, name: str, n_threads: int, args: list[ctypes._SimpleCData]) -> None:
        self.func = int(kernel(name).kernel.ptr)  # the CUfunction behind CuPy's RawKernel
        self.grid = max(1, min((n_threads + BLOCK - 1) // BLOCK, 65535 * 16))
        self.empty = n_threads == 0
        self.args = PackedArgs(args)

    def __call__(self, stream: Any = None) -> None:
        if not self.empty:
            launch_kernel(self.func, self.grid, BLOCK, self.args, stream_ptr(stream))


class GatherLaunch(_Launch):
    """One prepared gather + dequantize of `n_out_rows` rows into float32 `out`.

    `rows` is an int32 array of n_out_rows indices readable by the device (a CuPy array, or the
    address of device or pinned host memory), or None for rows 0..n-1 (the staged path, where the
    rows were already gathered); `table_ptr` must be readable by the device; `err` is a device
    int32[3] error word. Buffers are bound by address: keep them alive. Calling it launches
    asynchronously on the given stream (raw handle, CuPy stream, or None for the current one),
    also inside a CUDA graph capture.
    """

    def __init__(
        self,
        table_ptr: int,
        n_table_rows: int,
        ggml_type: int | str,
        row_dim: int,
        rows: Any,
        n_out_rows: int,
        out: Any,
        err: Any,
    ) -> None:
        t = ggml_type_id(ggml_type)
        rb = row_nbytes(t, row_dim)
        if table_ptr % (4 if t == 0 else 2):
            raise ValueError(f"table address {table_ptr:#x} is not aligned for its type")
        u64, i64, i32 = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32
        super().__init__(
            "ple_gather_dequant",
            n_out_rows * row_dim,
            [
                u64(table_ptr),
                i64(n_table_rows),
                i64(rb),
                i32(row_dim),
                i32(t),
                u64(0 if rows is None else _ptr(rows)),
                i64(n_out_rows),
                u64(_ptr(out)),
                u64(_ptr(err)),
            ],
        )


class DeviceHashSpec:
    """A PleHashSpec uploaded once to the device, plus the two hash launches."""

    def __init__(self, spec: PleHashSpec) -> None:
        import cupy

        self.spec = spec
        self.mult = cupy.asarray(np.asarray(spec.layer_multipliers, dtype=np.uint64))
        self.offs = cupy.asarray(np.asarray(spec.head_offsets, dtype=np.uint32))
        self.vocab = cupy.asarray(np.asarray(spec.head_vocab_sizes, dtype=np.uint32))

    def launch(self, tok: Any, prev: Any, n_hist: int, n_tokens: int, rows_out: Any) -> _Launch:
        """A prepared hash launch (see ple_hash in CUDA_SOURCE for `prev` None vs given)."""
        s = self.spec
        u64, i64, i32 = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32
        return _Launch(
            "ple_hash",
            n_tokens * s.n_heads,
            [
                u64(_ptr(tok)),
                u64(0 if prev is None else _ptr(prev)),
                i64(n_hist),
                i64(n_tokens),
                i32(s.n_prev),
                i32(s.n_heads),
                i32(s.heads_per_ngram),
                i64(s.eos_token_id),
                u64(_ptr(self.mult)),
                u64(_ptr(self.offs)),
                u64(_ptr(self.vocab)),
                u64(_ptr(rows_out)),
            ],
        )

    def hash_prev(self, tokens: Any, prev: Any, n_tokens: int, rows_out: Any, stream: Any = None) -> None:
        """rows_out int32 [n_tokens * n_heads] from device tokens [n] and prev [n, n_prev]."""
        self.launch(tokens, prev, 0, n_tokens, rows_out)(stream)

    def hash_seq(self, seq: Any, n_hist: int, n_tokens: int, rows_out: Any, stream: Any = None) -> None:
        """rows_out for the last n_tokens of device `seq` (one sequence, from its start)."""
        self.launch(seq, None, n_hist, n_tokens, rows_out)(stream)
