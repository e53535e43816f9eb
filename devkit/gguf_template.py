"""A copy of a GGUF with another chat template (`tokenizer.chat_template`), written cheaply.

The template tests run the real engine on the tiny qwen4exp with each template of llama.cpp's
collection. Building the model again per template would cost seconds each; this rewrites only
the metadata: the key/value section is copied with the template's value replaced (or added),
the tensor table is copied as is (tensor offsets are relative to the data section), the padding
before the data section is recomputed for the alignment, and the tensor data is copied byte for
byte. For a 4 MB model that is a few milliseconds.

Also a command, for the benchmark model in benchmarks/README.md:
`python -m devkit.gguf_template MODEL.gguf TEMPLATE.jinja OUT.gguf` (from the repo root).
"""

from __future__ import annotations

import argparse
import os
import struct
import tempfile
from pathlib import Path

KEY = "tokenizer.chat_template"
_STRING, _ARRAY = 8, 9
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> bytes:
        n = self.take("Q")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def skip_value(self, vtype: int) -> None:
        if vtype == _STRING:
            self.string()
        elif vtype == _ARRAY:
            inner, count = self.take("I"), self.take("Q")
            for _ in range(count):
                self.skip_value(inner)
        else:
            self.pos += _SIZES[vtype]


def _string(value: bytes) -> bytes:
    return struct.pack("<Q", len(value)) + value


def with_chat_template(source: Path, template: str, dest: Path) -> Path:
    """Write `source` with `template` as its chat template to `dest` (atomically)."""
    data = Path(source).read_bytes()
    cur = _Cursor(data)
    if data[:4] != b"GGUF":
        raise ValueError(f"{source} is not a GGUF file")
    cur.pos = 4
    version, n_tensors, n_kv = cur.take("I"), cur.take("Q"), cur.take("Q")
    kvs: list[bytes] = []
    alignment = 32
    for _ in range(n_kv):
        start = cur.pos
        key = cur.string().decode()
        vtype = cur.take("I")
        value_at = cur.pos
        cur.skip_value(vtype)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", data, value_at)
        if key != KEY:
            kvs.append(data[start : cur.pos])
    kvs.append(_string(KEY.encode()) + struct.pack("<I", _STRING) + _string(template.encode()))
    infos_start = cur.pos
    for _ in range(n_tensors):
        cur.string()
        n_dims = cur.take("I")
        cur.pos += 8 * n_dims + 4 + 8  # dims, type, offset
    infos = data[infos_start : cur.pos]
    data_start = -(-cur.pos // alignment) * alignment
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * (-len(head) % alignment)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".gguf-template-", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.write(memoryview(data)[data_start:])
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("template", type=Path, help="a .jinja file")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    with_chat_template(args.model, args.template.read_text(encoding="utf-8"), args.out)


if __name__ == "__main__":
    main()
