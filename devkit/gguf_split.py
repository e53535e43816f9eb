"""Real GGUF files for fingerprint tests: a model split into shards the way llama.cpp's
gguf-split names and tags them, and a copy whose tensor data changed under an unchanged header.

The split is written by the `gguf` package's own writer (`split_max_tensors`), which names the
shards `<stem>-00001-of-00003.gguf` and writes `split.no` / `split.count` /
`split.tensors.count`, as gguf-split does; llama.cpp loads the result from its first shard.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from velo_chat.engine.llama import gguf_file


def split_gguf(src: Path, out: Path, *, max_tensors: int) -> list[Path]:
    """Write `src` as shards of at most `max_tensors` tensors next to `out` (whose stem names
    them); return the shard paths in order."""
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch, split_max_tensors=max_tensors)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer adds these itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    shards = sorted(out.parent.glob(f"{out.stem}-*-of-*.gguf"))
    assert len(shards) > 1, "the model should have been split"
    return shards


def copy_with_other_data(src: Path, dst: Path, *, stride: int = 4096) -> Path:
    """A copy of `src` whose header (metadata, tensor table, size) is unchanged but whose tensor
    data differs: one byte in every `stride` bytes of the data section is flipped, as a
    re-quantized or re-trained upload of the same architecture changes bytes everywhere."""
    shutil.copyfile(src, dst)
    header = gguf_file.read_header(dst)
    data = np.memmap(dst, dtype=np.uint8, mode="r+", offset=header.data_offset)
    data[::stride] ^= 0x5A
    data.flush()
    del data
    return dst
