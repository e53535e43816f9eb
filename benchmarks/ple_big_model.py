"""Write a qwen4exp model with the real PLE geometry for the stock-vs-provider benchmark.

    python benchmarks/ple_big_model.py OUT.gguf --tokenizer M.gguf [--table-gib 4]

The tiny test model's PLE table is 4,096 f32 rows of 32 values: its CPU gather costs next to
nothing, so it cannot show what the GPU gather saves. This one has the real model's geometry
where it matters for the gather: rows of 160 IQ4_NL values (90 bytes), 16 heads per token
(n-gram 3, 8 heads per n-gram), n_embd 2560, and a table of several GiB in host memory. The
other shapes are ones llama.cpp's CUDA backend runs whole (attention head dim 128, which its
flash attention supports, and recurrent conv channels a multiple of 128, which its SSM_CONV
needs; the tiny model's 32 and 64 fall back to the CPU and split its decode graph 10 ways), so
a decode step has one graph split with the provider and two without: what the provider removes
is what is measured. The rest is the tiny model's shape (4 layers, small experts), so it writes
in a minute.
`--tokenizer` takes any GGUF with a tokenizer (the tiny model's will do). The table's bytes are
random, with each block's scale set to a small finite f16 (a random scale could be inf or NaN).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: devkit/
from devkit import tiny_qwen4exp  # noqa: E402
from devkit.ple_table import GGML_TYPES, PleTableData  # noqa: E402

IQ4_NL_BLOCK_BYTES, IQ4_NL_BLOCK_VALUES = 18, 32

# the generator's fixed geometry, changed where CUDA would otherwise run an op on the CPU
REAL_SHAPES = {
    "HEAD_DIM": 128,
    "N_ROT": 64,
    "ROPE_SECTIONS": (11, 11, 10, 0),  # sums to N_ROT / 2
    "IDX_DIM": 64,  # the indexer key must be at least N_ROT long
    "SSM_STATE": 128,  # conv channels 2 * 128 + 2 * 128 = 512
}


def random_iq4_nl_table(rng: np.random.Generator, n_rows: int, row_dim: int) -> PleTableData:
    """Random IQ4_NL rows without the float copy the test generator keeps (30 GB here)."""
    n_blocks = row_dim // IQ4_NL_BLOCK_VALUES
    raw = np.frombuffer(rng.bytes(n_rows * n_blocks * IQ4_NL_BLOCK_BYTES), dtype=np.uint8).copy()
    blocks = raw.reshape(n_rows * n_blocks, IQ4_NL_BLOCK_BYTES)
    scale = np.array([0.008], dtype=np.float16).view(np.uint8)
    blocks[:, 0], blocks[:, 1] = scale[0], scale[1]
    return PleTableData(GGML_TYPES["iq4_nl"], raw.reshape(n_rows, n_blocks * IQ4_NL_BLOCK_BYTES), np.empty(0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--table-gib", type=float, default=4.0)
    args = ap.parse_args()
    heads, row_dim = 16, 160
    row_bytes = row_dim // IQ4_NL_BLOCK_VALUES * IQ4_NL_BLOCK_BYTES
    head_vocab = int(args.table_gib * 2**30 / row_bytes / heads)

    def table(rng, n_rows, dim, ple_type, encode_index):  # the generator's make_ple_table
        return random_iq4_nl_table(rng, n_rows, dim)

    t0 = time.perf_counter()
    tiny_qwen4exp.make_ple_table = table  # type: ignore[assignment]
    for name, value in REAL_SHAPES.items():
        setattr(tiny_qwen4exp, name, value)
    tiny_qwen4exp.build_tiny_qwen4exp(
        args.out,
        tokenizer_gguf=args.tokenizer,
        ple_type="iq4_nl",
        n_embd=heads * row_dim,
        ple_ngram_size=3,
        ple_heads_per_ngram=heads // 2,
        ple_head_vocab=head_vocab,
    )
    size = args.out.stat().st_size / 2**30
    print(
        f"{args.out}: {size:.2f} GiB, {heads} heads x {head_vocab} rows of {row_dim} iq4_nl values, "
        f"written in {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
