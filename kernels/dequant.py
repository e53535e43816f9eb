"""numpy reference for gathering rows of a ggml table and dequantizing them to float32.

This is the specification the CuPy kernel is tested against, and it is itself tested against
llama.cpp's own CPU `get_rows` (tests/test_kernels_llama.py). It follows ggml exactly:

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
"""

from __future__ import annotations

import numpy as np

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_Q8_0 = 8
GGML_TYPE_IQ4_NL = 20
GGML_TYPE_BF16 = 30

GGML_TYPE_NAMES: dict[int, str] = {
    GGML_TYPE_F32: "f32",
    GGML_TYPE_F16: "f16",
    GGML_TYPE_Q8_0: "q8_0",
    GGML_TYPE_IQ4_NL: "iq4_nl",
    GGML_TYPE_BF16: "bf16",
}
SUPPORTED_TYPES: tuple[int, ...] = tuple(GGML_TYPE_NAMES)

# (values per block, bytes per block), as ggml's type traits
_BLOCKS: dict[int, tuple[int, int]] = {
    GGML_TYPE_F32: (1, 4),
    GGML_TYPE_F16: (1, 2),
    GGML_TYPE_BF16: (1, 2),
    GGML_TYPE_Q8_0: (32, 34),
    GGML_TYPE_IQ4_NL: (32, 18),
}

# ggml-common.h kvalues_iq4nl
KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)


def ggml_type_id(t: int | str) -> int:
    """Accept a ggml type id or its lower-case name ("iq4_nl") and return the id."""
    if isinstance(t, str):
        for k, v in GGML_TYPE_NAMES.items():
            if v == t.lower():
                return k
        raise ValueError(f"unsupported table type {t!r}; supported: {sorted(GGML_TYPE_NAMES.values())}")
    if t not in _BLOCKS:
        raise ValueError(f"unsupported ggml type {t}; supported: {sorted(GGML_TYPE_NAMES.values())}")
    return int(t)


def row_nbytes(ggml_type: int | str, row_dim: int) -> int:
    """Bytes of one row of `row_dim` values; rows of the block types must be a multiple of 32."""
    t = ggml_type_id(ggml_type)
    blk, size = _BLOCKS[t]
    if row_dim <= 0 or row_dim % 32:
        raise ValueError(f"row length {row_dim} is not a positive multiple of 32")
    return row_dim // blk * size


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


def check_rows(rows: np.ndarray, n_rows: int) -> np.ndarray:
    """Return rows as int64, raising IndexError if any lies outside [0, n_rows)."""
    r = np.asarray(rows)
    if not np.issubdtype(r.dtype, np.integer):
        raise TypeError(f"row indices must be integers, got {r.dtype}")
    r = r.astype(np.int64, copy=False)
    if r.size and (r.min() < 0 or r.max() >= n_rows):
        bad = r[(r < 0) | (r >= n_rows)].reshape(-1)[0]
        raise IndexError(f"row index {int(bad)} outside the table of {n_rows} rows")
    return r


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
    bsize = _BLOCKS[t][1]
    out = rng.integers(0, 256, size=(n_rows, nb, bsize), dtype=np.uint8)
    out[..., :2] = finite_bits((n_rows, nb), "uint16", 0x7C00).view(np.uint8).reshape(n_rows, nb, 2)
    return out.reshape(n_rows, rb)
