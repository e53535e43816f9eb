"""Where a PLE table's bytes lie in a GGUF file, as the kernels map it.

The engine reads the GGUF header with the project's one GGUF parser (its `gguf_file`) and hands
the tensor's facts to `table_location` (the engine's `ple_provider.locate_tensor`), which checks
that the type is one the kernels decode and sizes the byte range: `kernels/` never imports the
engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .dequant import GGML_TYPE_NAMES, row_nbytes


@dataclass(frozen=True)
class TableLocation:
    """A 2-D ggml tensor's absolute byte range. `shape` is ggml order: (row_dim, n_rows)."""

    path: Path
    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPE_NAMES.get(self.ggml_type, f"type{self.ggml_type}")

    @property
    def row_dim(self) -> int:
        return self.shape[0]

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64))

    @property
    def row_bytes(self) -> int:
        return row_nbytes(self.ggml_type, self.row_dim)


def table_location(
    path: str | os.PathLike[str], name: str, ggml_type: int, shape: tuple[int, ...], offset: int
) -> TableLocation:
    """Tensor `name` of the GGUF at `path`, from its header's facts: ggml type, shape (ggml
    order) and absolute data offset; raises ValueError for a type the kernels do not decode."""
    if ggml_type not in GGML_TYPE_NAMES:
        raise ValueError(
            f"{path}: {name!r} has ggml type {ggml_type}; the PLE kernels decode "
            f"{sorted(GGML_TYPE_NAMES.values())}"
        )
    row_dim = shape[0]
    n_rows = int(np.prod(shape[1:], dtype=np.int64))
    nbytes = row_nbytes(ggml_type, row_dim) * n_rows
    return TableLocation(Path(path), name, ggml_type, tuple(shape), offset, nbytes)
