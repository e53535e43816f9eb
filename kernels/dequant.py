"""The ggml table types the PLE kernels decode: their ids, names and row sizes, and the row-index
check every gather runs first.

The numpy reference the kernels are tested against (dequantize, gather, random tables) is
`devkit/ple_reference.py`, outside the shipped package.
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
