"""Contents of the tiny model's PLE table (`per_layer_token_embd.weight`), in five ggml types.

Why the table is built block by block instead of quantizing float data: the PLE gather tests
compare llama.cpp's `get_rows` result with a reference bit for bit, so the test must
know the *exact* dequantized value of every element. For Q8_0 and IQ4_NL we therefore draw the
quantized representation directly (a per-block f16 scale `d` and the integer codes) and derive
the float values from it with ggml's formulas (`q * d` and `d * kvalues_iq4nl[code]`, both a
single float32 product). For F16 and BF16 the values are rounded to the type first. Either way
`PleTableData.values` is exactly what ggml dequantizes to.

Index-encoding rows (`encode_index=True`): element k of row r holds the level
`(nibble(r, k % 8) + k) % 16`, where nibble(r, j) is bits 4j..4j+3 of r, mapped to the value
`IQ4_NL_KVALUES[level] * 2**-7`. Why this form:
- every value is exact in all five types: the integers -127..113 fit bf16's 8-bit significand,
  the scale 2**-7 is a power of two (exact in f16), so Q8_0 stores it as `d = 2**-7, q = kvalue`
  and IQ4_NL as `d = 2**-7, code = level`, with no rounding anywhere;
- 8 nibbles cover any int32 row index, and the `+ k` makes each position within a row distinct,
  so a transposed or shifted gather does not decode to a plausible row;
- the 32-value pattern repeats every 8 elements, so any row length that is a multiple of 32 (the
  Q8_0/IQ4_NL block size) carries at least 4 redundant copies that `decode_index_rows` checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

PLE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "iq4_nl")

GGML_TYPES: dict[str, GGMLQuantizationType] = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "iq4_nl": GGMLQuantizationType.IQ4_NL,
}

# ggml-common.h `kvalues_iq4nl`
IQ4_NL_KVALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)
BLOCK = 32  # QK8_0 == QK4_NL
INDEX_SCALE = np.float32(2.0**-7)
_NIBBLES = 8


@dataclass(frozen=True)
class PleTableData:
    """One generated table: the bytes to write and the values ggml will dequantize them to."""

    ggml_type: GGMLQuantizationType
    raw: np.ndarray
    """What `GGUFWriter.add_tensor(..., raw_dtype=ggml_type)` takes: float32/float16 rows for
    F32/F16, uint8 rows of packed bytes for BF16/Q8_0/IQ4_NL."""
    values: np.ndarray
    """float32 [n_rows, row_dim]: the exact dequantized table."""


def check_row_dim(ple_type: str, row_dim: int) -> None:
    """ggml stores quantized rows as whole 32-value blocks; reject what the writer cannot store."""
    if ple_type not in GGML_TYPES:
        raise ValueError(f"ple_type must be one of {PLE_TYPES}, got {ple_type!r}")
    if ple_type in ("q8_0", "iq4_nl") and row_dim % BLOCK:
        raise ValueError(f"a {ple_type} PLE row must be a multiple of {BLOCK} values, got {row_dim}")


def index_levels(n_rows: int, row_dim: int) -> np.ndarray:
    """uint8 [n_rows, row_dim]: the 4-bit level of each element of the index-encoding table."""
    r = np.arange(n_rows, dtype=np.int64)[:, None]
    k = np.arange(row_dim, dtype=np.int64)[None, :]
    nib = (r >> (4 * (k % _NIBBLES))) & 0xF
    return ((nib + k) % 16).astype(np.uint8)


def decode_index_rows(values: np.ndarray) -> np.ndarray:
    """Row index of each row of an index-encoding table (any leading shape, last axis = row).

    Returns int64 with -1 where a row is not a valid encoding (a value off the level grid, or
    redundant copies that disagree), so a caller can compare against the expected indices.
    """
    v = np.asarray(values, dtype=np.float32)
    flat = v.reshape(-1, v.shape[-1])
    row_dim = flat.shape[1]
    scaled = flat / INDEX_SCALE  # exact: dividing by a power of two
    lookup = {int(q): i for i, q in enumerate(IQ4_NL_KVALUES)}
    out = np.full(flat.shape[0], -1, dtype=np.int64)
    k = np.arange(row_dim)
    for i, row in enumerate(scaled):
        if not np.all(np.isin(row, IQ4_NL_KVALUES.astype(np.float32))):
            continue
        levels = np.array([lookup[int(x)] for x in row], dtype=np.int64)
        nib = (levels - k) % 16
        parts = [nib[j::_NIBBLES] for j in range(min(_NIBBLES, row_dim))]
        if any(np.any(p != p[0]) for p in parts):
            continue
        out[i] = sum(int(p[0]) << (4 * j) for j, p in enumerate(parts))
    return out.reshape(v.shape[:-1])


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits of float32 x, round-to-nearest-even as ggml's fp32->bf16 (no NaNs here)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _bf16_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def _pack_q8_0(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """block_q8_0 {f16 d; int8 qs[32]} rows. d: [rows, blocks] f16, q: [rows, row_dim] int8."""
    n_rows, row_dim = q.shape
    blk = np.dtype([("d", "<f2"), ("qs", "i1", (BLOCK,))])
    arr = np.empty((n_rows, row_dim // BLOCK), dtype=blk)
    arr["d"] = d
    arr["qs"] = q.reshape(n_rows, -1, BLOCK)
    return arr.view(np.uint8).reshape(n_rows, -1)


def _pack_iq4_nl(d: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """block_iq4_nl {f16 d; uint8 qs[16]}: qs[j] = code[j] | code[j+16] << 4.

    The nibble order is ggml's `dequantize_row_iq4_nl`: low nibbles are elements 0..15.
    """
    n_rows, row_dim = codes.shape
    c = codes.reshape(n_rows, -1, BLOCK).astype(np.uint8)
    qs = c[:, :, : BLOCK // 2] | (c[:, :, BLOCK // 2 :] << 4)
    blk = np.dtype([("d", "<f2"), ("qs", "u1", (BLOCK // 2,))])
    arr = np.empty((n_rows, row_dim // BLOCK), dtype=blk)
    arr["d"] = d
    arr["qs"] = qs
    return arr.view(np.uint8).reshape(n_rows, -1)


def _per_element(d: np.ndarray) -> np.ndarray:
    return np.repeat(d.astype(np.float32), BLOCK, axis=1)


def make_ple_table(
    rng: np.random.Generator, n_rows: int, row_dim: int, ple_type: str, encode_index: bool
) -> PleTableData:
    """Build the table; random values are O(1), which the model renormalises anyway."""
    check_row_dim(ple_type, row_dim)
    gtype = GGML_TYPES[ple_type]
    quantized = ple_type in ("q8_0", "iq4_nl")
    if quantized:
        n_blocks = row_dim // BLOCK
        if encode_index:
            d = np.full((n_rows, n_blocks), INDEX_SCALE, dtype=np.float16)
            codes = index_levels(n_rows, row_dim)
        else:
            d = rng.uniform(0.004, 0.012, size=(n_rows, n_blocks)).astype(np.float16)
            codes = rng.integers(0, 16, size=(n_rows, row_dim), dtype=np.uint8)
        if ple_type == "iq4_nl":
            values = _per_element(d) * IQ4_NL_KVALUES[codes].astype(np.float32)
            return PleTableData(gtype, _pack_iq4_nl(d, codes), values)
        if encode_index:
            q = IQ4_NL_KVALUES[codes]
        else:
            q = rng.integers(-127, 128, size=(n_rows, row_dim)).astype(np.int8)
        values = q.astype(np.float32) * _per_element(d)
        return PleTableData(gtype, _pack_q8_0(d, q), values)

    if encode_index:
        x = IQ4_NL_KVALUES[index_levels(n_rows, row_dim)].astype(np.float32) * INDEX_SCALE
    else:
        x = rng.standard_normal((n_rows, row_dim)).astype(np.float32)
    if ple_type == "f32":
        return PleTableData(gtype, x, x)
    if ple_type == "f16":
        h = x.astype(np.float16)
        return PleTableData(gtype, h, h.astype(np.float32))
    b = _bf16_round(x)
    return PleTableData(gtype, b.view(np.uint8).reshape(n_rows, -1), _bf16_to_f32(b))
