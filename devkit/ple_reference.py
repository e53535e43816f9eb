"""numpy reference for the PLE kernels, and tables to test and benchmark them on.

`gather_dequant` gathers rows of a ggml table and dequantizes them to float32: the
specification the CuPy kernel is tested against, itself tested against llama.cpp's own CPU
`get_rows` (tests/test_kernels_llama.py). It follows ggml exactly:

- F32 rows are copied bit for bit;
- F16 and BF16 are widened to float32 (both conversions are exact);
- Q8_0 blocks are `qs[j] * d` (ggml-quants.c `dequantize_row_q8_0`);
- IQ4_NL blocks are `d * kvalues_iq4nl[nibble]`, low nibbles first, then high nibbles
  (`dequantize_row_iq4_nl`).

Each product is a float16-derived scale (11 significant bits) times an integer of at most 8 bits,
so it is exact in float32: any evaluation order on any device gives the same bits. That is why a
bit-exact comparison between the GPU kernel and this reference is the right test.

The output layout is that of `ggml_get_rows(table, rows)` followed by the reshape in
`build_inp_ple`: token-major, then head, then the row's values: float32 [n_tokens, n_heads*row_dim].

`random_table` draws valid random rows of each type; `write_single_tensor_gguf` writes the
smallest valid GGUF holding one tensor, so the GPU tests and `benchmarks/ple_gather.py` make
multi-GiB tables (sparse until filled) without building a whole model.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from velo_chat.kernels.dequant import (
    GGML_TYPE_BF16,
    GGML_TYPE_F16,
    GGML_TYPE_F32,
    GGML_TYPE_Q8_0,
    check_rows,
    ggml_type_id,
    row_nbytes,
)
from velo_chat.kernels.gguf_tensor import TableLocation

# ggml-common.h kvalues_iq4nl
KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)


def table_view(buf: np.ndarray, ggml_type: int | str, row_dim: int) -> np.ndarray:
    """View a flat byte buffer as uint8 [n_rows, row_bytes] (no copy)."""
    rb = row_nbytes(ggml_type, row_dim)
    flat = np.asarray(buf).reshape(-1).view(np.uint8)
    if flat.size % rb:
        raise ValueError(f"buffer of {flat.size} bytes is not a whole number of {rb}-byte rows")
    return flat.reshape(-1, rb)


def _f16_scales(blocks: np.ndarray) -> np.ndarray:
    """The leading float16 `d` of each block, widened to float32, shaped for broadcasting."""
    return np.ascontiguousarray(blocks[..., :2]).view("<f2").astype(np.float32)


def dequantize_rows(raw: np.ndarray, ggml_type: int | str, row_dim: int) -> np.ndarray:
    """Dequantize uint8 [n, row_bytes] rows to float32 [n, row_dim] with ggml's formulas."""
    t = ggml_type_id(ggml_type)
    rb = row_nbytes(t, row_dim)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, rb)
    n = raw.shape[0]
    if t == GGML_TYPE_F32:
        return raw.view("<f4").copy()
    if t == GGML_TYPE_F16:
        return raw.view("<f2").astype(np.float32)
    if t == GGML_TYPE_BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    nb = row_dim // 32
    if t == GGML_TYPE_Q8_0:
        blocks = raw.reshape(n, nb, 34)
        q8 = blocks[..., 2:].view(np.int8).astype(np.float32)
        return (q8 * _f16_scales(blocks)).reshape(n, row_dim)
    # IQ4_NL
    blocks = raw.reshape(n, nb, 18)
    qs = blocks[..., 2:]
    vals = np.concatenate([KVALUES_IQ4NL[qs & 0xF], KVALUES_IQ4NL[qs >> 4]], axis=-1)
    return (_f16_scales(blocks) * vals.astype(np.float32)).reshape(n, row_dim)


def gather_dequant(table: np.ndarray, ggml_type: int | str, row_dim: int, rows: np.ndarray) -> np.ndarray:
    """Reference gather: table uint8 [n_rows, row_bytes], rows int [n_tokens, n_heads].

    Returns float32 [n_tokens, n_heads * row_dim], the layout of llama.cpp's `ple_embd`.
    """
    rows = np.asarray(rows)
    if rows.ndim != 2:
        raise ValueError(f"rows must be [n_tokens, n_heads], got shape {rows.shape}")
    idx = check_rows(rows, table.shape[0]).reshape(-1)
    out = dequantize_rows(table[idx], ggml_type, row_dim)
    return out.reshape(rows.shape[0], rows.shape[1] * row_dim)


def random_table(ggml_type: int | str, n_rows: int, row_dim: int, rng: np.random.Generator) -> np.ndarray:
    """Random rows of valid, finite content, as uint8 [n_rows, row_bytes].

    Floats are drawn as random bit patterns with a non-maximal exponent, so zeros, subnormals and
    extreme magnitudes all occur; NaN/inf are excluded because ggml leaves their payloads to the
    hardware. Quantized blocks get such a random float16 scale and random quants.
    """
    t = ggml_type_id(ggml_type)
    rb = row_nbytes(t, row_dim)

    def finite_bits(shape: tuple[int, ...], dtype: str, exp_mask: int) -> np.ndarray:
        info = np.iinfo(dtype)
        bits = rng.integers(0, int(info.max) + 1, size=shape, dtype=dtype)
        top_exp_bit = 1 << (exp_mask.bit_length() - 1)
        inf_nan = (bits & exp_mask) == exp_mask
        bits[inf_nan] ^= np.array(top_exp_bit, dtype=dtype)  # halve the exponent: finite again
        return bits

    if t == GGML_TYPE_F32:
        return finite_bits((n_rows, row_dim), "uint32", 0x7F800000).view(np.uint8)
    if t == GGML_TYPE_F16:
        return finite_bits((n_rows, row_dim), "uint16", 0x7C00).view(np.uint8)
    if t == GGML_TYPE_BF16:
        return finite_bits((n_rows, row_dim), "uint16", 0x7F80).view(np.uint8)
    nb = row_dim // 32
    bsize = row_nbytes(t, 32)  # one block
    out = rng.integers(0, 256, size=(n_rows, nb, bsize), dtype=np.uint8)
    out[..., :2] = finite_bits((n_rows, nb), "uint16", 0x7C00).view(np.uint8).reshape(n_rows, nb, 2)
    return out.reshape(n_rows, rb)


# -- a GGUF of one tensor ----------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_GGUF_UINT32, _GGUF_ARRAY, _GGUF_UINT64 = 4, 9, 10


def _pack_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_single_tensor_gguf(
    path: str | os.PathLike[str],
    name: str,
    ggml_type: int,
    shape: tuple[int, ...],
    *,
    u32_values: dict[str, int] | None = None,
    u64_arrays: dict[str, list[int]] | None = None,
) -> TableLocation:
    """Write a GGUF header for one tensor and size the file; the data section stays sparse.

    The caller fills the bytes it cares about (random rows, say) at `TableLocation.offset`;
    untouched pages read as zeros and take no disk space.
    """
    kvs = [_pack_string(k) + struct.pack("<II", _GGUF_UINT32, v) for k, v in (u32_values or {}).items()]
    for k, vals in (u64_arrays or {}).items():
        arr = np.asarray(vals, dtype="<u8")
        kvs.append(_pack_string(k) + struct.pack("<IIQ", _GGUF_ARRAY, _GGUF_UINT64, arr.size) + arr.tobytes())
    tinfo = _pack_string(name) + struct.pack("<I", len(shape))
    tinfo += b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<IQ", ggml_type, 0)
    head = GGUF_MAGIC + struct.pack("<IQQ", 3, 1, len(kvs)) + b"".join(kvs) + tinfo
    data_offset = -(-len(head) // DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT
    nbytes = row_nbytes(ggml_type, shape[0]) * int(np.prod(shape[1:], dtype=np.int64))
    with open(path, "wb") as f:
        f.write(head.ljust(data_offset, b"\0"))
        f.truncate(data_offset + nbytes)
    return TableLocation(Path(path), name, ggml_type, tuple(shape), data_offset, nbytes)
