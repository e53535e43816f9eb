"""Where a tensor's bytes lie in a GGUF file, and a writer for single-tensor test tables.

Reading reuses the engine's header reader (`velo_chat.engine.llama.gguf_file`, no tensor data read, no
textual import), so the project has one GGUF parser. This module only turns its relative tensor
offsets into absolute byte ranges that can be mapped, and checks the type is one the kernels decode.

`write_single_tensor_gguf` writes the smallest valid GGUF holding one tensor, used by the GPU tests
and the benchmark to make multi-GiB tables (sparse until filled) without building a whole model.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from velo_chat.engine.llama.gguf_file import GGUFHeader, read_header
from .dequant import GGML_TYPE_NAMES, row_nbytes

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_GGUF_UINT32, _GGUF_ARRAY, _GGUF_UINT64 = 4, 9, 10


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


def locate_tensor(path: str | os.PathLike[str], name: str, header: GGUFHeader | None = None) -> TableLocation:
    """Offset, type and shape of tensor `name`; raises KeyError/ValueError with the reason."""
    hdr = header or read_header(Path(path))
    info = hdr.tensor(name)
    if info is None:
        raise KeyError(f"{path}: no tensor named {name!r}")
    if info.ggml_type not in GGML_TYPE_NAMES:
        raise ValueError(
            f"{path}: {name!r} has ggml type {info.ggml_type}; the PLE kernels decode "
            f"{sorted(GGML_TYPE_NAMES.values())}"
        )
    row_dim = info.shape[0]
    n_rows = int(np.prod(info.shape[1:], dtype=np.int64))
    nbytes = row_nbytes(info.ggml_type, row_dim) * n_rows
    return TableLocation(Path(path), name, info.ggml_type, info.shape, hdr.data_offset + info.offset, nbytes)


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
