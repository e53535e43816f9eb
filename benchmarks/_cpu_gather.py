"""The stock pattern's CPU half: ggml's IQ4_NL `get_rows` as a small C function (OpenMP).

Why C and not numpy: the baseline must be as fast as llama.cpp's own CPU gather, or beating it
proves nothing. numpy spends ~20 us in per-call overhead on 16 rows; ggml's loop spends ~1 us.
The C source is compiled with the system `cc` at first use into a temp dir (the device machine
has one: nvcc needs it).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

C_SOURCE = r"""
#include <stdint.h>
#include <string.h>
static const int8_t kv[16] = {-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113};
static inline float f16(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) { float f = (float)m * 5.9604644775390625e-8f; memcpy(&u, &f, 4); u |= s; }
    else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 112) << 23) | (m << 13);
    float f; memcpy(&f, &u, 4); return f;
}
void gather_iq4_nl(const uint8_t *table, long long row_bytes, int row_dim,
                   const int32_t *rows, long long n, float *out) {
    #pragma omp parallel for schedule(static) if (n >= 256)
    for (long long o = 0; o < n; ++o) {
        const uint8_t *src = table + (long long) rows[o] * row_bytes;
        float *y = out + o * row_dim;
        for (int b = 0; b < row_dim / 32; ++b) {
            const uint8_t *blk = src + b * 18;
            uint16_t dh; memcpy(&dh, blk, 2);
            const float d = f16(dh);
            for (int j = 0; j < 16; ++j) {
                y[b * 32 + j]      = d * kv[blk[2 + j] & 0xf];
                y[b * 32 + j + 16] = d * kv[blk[2 + j] >> 4];
            }
        }
    }
}
void gather_raw(const uint8_t *table, long long row_bytes, const int32_t *rows, long long n,
                uint8_t *out) {
    #pragma omp parallel for schedule(static) if (n >= 256)
    for (long long o = 0; o < n; ++o)
        memcpy(out + o * row_bytes, table + (long long) rows[o] * row_bytes, row_bytes);
}
"""


def load_cpu_gather() -> tuple[Callable[..., None], Callable[..., None]]:
    """(gather, gather_raw), both taking raw addresses:
    gather(table_ptr, row_bytes, row_dim, rows_ptr, n_rows, out_f32_ptr) dequantizes IQ4_NL;
    gather_raw(table_ptr, row_bytes, rows_ptr, n_rows, out_ptr) copies the raw rows.

    Raw integer arguments keep the ctypes call near 1 us, so the Python harness does not inflate
    the stock pattern's time. Raises RuntimeError if no C compiler works here.
    """
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("the stock-pattern baseline needs a C compiler (cc/gcc)")
    d = Path(tempfile.mkdtemp(prefix="ple_cpu_gather_"))
    (d / "g.c").write_text(C_SOURCE)
    subprocess.run(
        [cc, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", str(d / "g.c"), "-o", str(d / "g.so")],
        check=True,
        capture_output=True,
    )
    lib = ctypes.CDLL(str(d / "g.so"))
    vp, ll = ctypes.c_void_p, ctypes.c_longlong
    lib.gather_iq4_nl.argtypes = [vp, ll, ctypes.c_int, vp, ll, vp]
    lib.gather_raw.argtypes = [vp, ll, vp, ll, vp]
    lib.gather_iq4_nl.restype = lib.gather_raw.restype = None
    return lib.gather_iq4_nl, lib.gather_raw
