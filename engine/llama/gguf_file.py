"""A light GGUF header reader: enough to reject a bad file with a clear message before llama.cpp
sees it, and to fingerprint a model without reading all of its weights.

llama.cpp answers a truncated or foreign file with a NULL model and a log line; users deserve to
be told "this file is truncated (12.3 MB of 98.4 MB)" instead. The reader parses the metadata and
the tensor table (no tensor data) and checks that the data section is as long as the tensors need.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import GGUFError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> struct format (scalars).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

# ggml type -> (values per block, bytes per block), for the data-size check. Types missing here
# are skipped by the check (their offsets are still checked against the file size).
GGML_BLOCK = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
}

GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip
"""ggml's type names (ggml.h `enum ggml_type`), for messages."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first)
    ggml_type: int
    offset: int  # relative to the data section


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int
    header_sha256: str

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


class _Reader:
    def __init__(self, fh: BinaryIO, size: int, path: Path) -> None:
        self.fh, self.size, self.path = fh, size, path

    def read(self, n: int) -> bytes:
        data = self.fh.read(n)
        if len(data) != n:
            raise GGUFError(f"{self.path}: truncated GGUF header ({self.size} bytes in all)")
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("Q")
        if n > self.size:
            raise GGUFError(f"{self.path}: corrupt GGUF header (string of {n} bytes)")
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool, small: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.unpack("I"), self.unpack("Q")
            if count > self.size:
                raise GGUFError(f"{self.path}: corrupt GGUF header (array of {count} items)")
            numbers = item_type in _SCALARS
            if numbers and not keep and count > small:
                self.fh.seek(struct.calcsize(_SCALARS[item_type]) * count, 1)
                return None
            items = [self.value(item_type, keep) for _ in range(count)]
            return items if keep or numbers else None
        raise GGUFError(f"{self.path}: corrupt GGUF header (value type {vtype})")


def read_header(path: Path, *, keep_arrays: bool = False, small_arrays: int = 0) -> GGUFHeader:
    """Parse a GGUF's metadata and tensor table; raise GGUFError if it is not a whole GGUF.

    Arrays (the tokenizer's vocab and merges) are skipped (None) unless `keep_arrays`; numeric
    arrays of at most `small_arrays` items (per-layer settings) are kept either way.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        fh = path.open("rb")
    except FileNotFoundError:
        raise GGUFError(f"model file not found: {path}") from None
    except IsADirectoryError:
        raise GGUFError(f"model path is a directory, not a GGUF file: {path}") from None
    except OSError as exc:
        raise GGUFError(f"cannot open model file {path}: {exc.strerror}") from None
    with fh:
        if fh.read(4) != GGUF_MAGIC:
            raise GGUFError(f"not a GGUF file (bad magic): {path}")
        r = _Reader(fh, size, path)
        version = r.unpack("I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: unsupported GGUF version {version}")
        n_tensors, n_kv = r.unpack("Q"), r.unpack("Q")
        if n_tensors > size or n_kv > size:
            raise GGUFError(f"{path}: corrupt GGUF header")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            metadata[key] = r.value(r.unpack("I"), keep_arrays, small_arrays)
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.unpack("I")
            if n_dims > 8:
                raise GGUFError(f"{path}: corrupt GGUF tensor table")
            shape = tuple(r.unpack("Q") for _ in range(n_dims))
            tensors.append(TensorInfo(name, shape, r.unpack("I"), r.unpack("Q")))
        header_end = fh.tell()
        fh.seek(0)
        digest = hashlib.sha256(fh.read(header_end))
    digest.update(str(size).encode())
    align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT) or DEFAULT_ALIGNMENT)
    data_offset = (header_end + align - 1) // align * align
    header = GGUFHeader(path, version, metadata, tuple(tensors), data_offset, size, digest.hexdigest())
    _check_data_size(header)
    return header


def tensor_nbytes(t: TensorInfo) -> int | None:
    block = GGML_BLOCK.get(t.ggml_type)
    if block is None:
        return None
    n = 1
    for d in t.shape:
        n *= d
    return n // block[0] * block[1]


def _check_data_size(h: GGUFHeader) -> None:
    need = h.data_offset
    for t in h.tensors:
        nbytes = tensor_nbytes(t) or 1
        need = max(need, h.data_offset + t.offset + nbytes)
    if need > h.file_size:
        raise GGUFError(
            f"truncated GGUF: {h.path} has {h.file_size:,} bytes but its tensors need "
            f"{need:,} (an interrupted download?)"
        )


# -- split models and the fingerprint -----------------------------------------------------------

SAMPLE_BLOCKS = 16
SAMPLE_BYTES = 64 << 10
TENSOR_SAMPLE_BYTES = 4 << 10
FINGERPRINT_VERSION = b"velo-model-fingerprint-2"


def shard_paths(header: GGUFHeader) -> list[Path]:
    """Every file of the model, in order: the file itself, or for a split model (`split.count`
    > 1) its shards, named as llama.cpp's `llama_split_path` names them
    (`<prefix>-00001-of-00004.gguf`). llama.cpp loads a split model from its first shard only,
    so another shard is refused here with a line that says which file to use."""
    count = int(header.metadata.get("split.count", 0) or 0)
    if count <= 1:
        return [header.path]
    no = int(header.metadata.get("split.no", 0) or 0)
    name = header.path.name
    postfix = f"-{no + 1:05d}-of-{count:05d}.gguf"
    if not name.endswith(postfix):
        raise GGUFError(
            f"{header.path} is shard {no + 1} of {count} of a split model, but not "
            f"named like one (…{postfix})"
        )
    prefix = name[: -len(postfix)]
    first = header.path.with_name(f"{prefix}-00001-of-{count:05d}.gguf")
    if no != 0:
        raise GGUFError(
            f"{header.path} is shard {no + 1} of {count} of a split model; load its first shard, {first.name}"
        )
    return [header.path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def shard_headers(first: GGUFHeader) -> list[GGUFHeader]:
    """The headers of every file of the model (`shard_paths`), `first` first: a split model's
    tensors are spread over its shards (raises `GGUFError` for a missing or bad shard)."""
    paths = shard_paths(first)
    for i, p in enumerate(paths[1:], start=2):
        if not p.exists():
            raise GGUFError(f"shard {i} of {len(paths)} is missing: {p}")
    return [first] + [read_header(p) for p in paths[1:]]


def _shard_header(path: Path, index: int, count: int) -> GGUFHeader:
    if not path.exists():
        raise GGUFError(f"shard {index + 1} of {count} is missing: {path}")
    header = read_header(path)
    no = int(header.metadata.get("split.no", -1))
    if no != index or int(header.metadata.get("split.count", 0) or 0) != count:
        raise GGUFError(
            f"{path} is shard {no + 1} of {header.metadata.get('split.count')}, "
            f"expected shard {index + 1} of {count}"
        )
    return header


def _data_samples(header: GGUFHeader, digest: Any) -> None:
    """Feed `digest` with fixed samples of the tensor data: `SAMPLE_BLOCKS` blocks of
    `SAMPLE_BYTES` spread evenly over the data section, and the first `TENSOR_SAMPLE_BYTES`
    of every tensor (a re-quantized or re-trained upload changes bytes everywhere; one fixed
    tensor changes at least its start, where a quantized tensor keeps its first block scales).
    About 1 MiB plus one page per tensor, whatever the size of the file."""
    start, end = header.data_offset, header.file_size
    span = max(0, end - start)
    offsets = (
        sorted({start + (span - SAMPLE_BYTES) * k // (SAMPLE_BLOCKS - 1) for k in range(SAMPLE_BLOCKS)})
        if span > SAMPLE_BYTES
        else [start]
    )
    reads = [(off, min(SAMPLE_BYTES, end - off)) for off in offsets]
    reads += [
        (start + t.offset, min(TENSOR_SAMPLE_BYTES, end - start - t.offset))
        for t in header.tensors
        if t.offset < span
    ]
    fd = os.open(header.path, os.O_RDONLY)
    try:
        for off, n in reads:
            data = os.pread(fd, n, off)
            digest.update(off.to_bytes(8, "little") + len(data).to_bytes(8, "little") + data)
    finally:
        os.close(fd)


def model_fingerprint(header: GGUFHeader) -> str:
    """What a saved sequence state is only valid for: a hash over every shard of the model, of
    its header (metadata and tensor table), its size and fixed samples of its tensor data.

    The header alone is not enough: a re-upload that keeps the architecture and quantization
    (same header, same size, other weights) or a changed later shard of a split model would
    restore another model's state. Reading all the weights at each start is not an option on a
    100 GB model, so the data is sampled (`_data_samples`); the path is not hashed, so a model
    moved or copied elsewhere keeps its checkpoints. Raises GGUFError for a missing shard."""
    paths = shard_paths(header)
    digest = hashlib.sha256(FINGERPRINT_VERSION)
    for i, path in enumerate(paths):
        shard = header if i == 0 else _shard_header(path, i, len(paths))
        digest.update(bytes.fromhex(shard.header_sha256))  # header bytes and file size
        _data_samples(shard, digest)
    return digest.hexdigest()
