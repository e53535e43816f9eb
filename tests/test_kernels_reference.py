"""The numpy references of the PLE path (hash, dequant, GGUF location) on hand-computed cases.

The comparison with llama.cpp itself is in test_kernels_llama.py; the GPU kernels are checked
against these references in test_kernels_gpu.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from devkit.ple_reference import (
    KVALUES_IQ4NL,
    dequantize_rows,
    gather_dequant,
    random_table,
    write_single_tensor_gguf,
)
from velo_chat.engine.llama.ple_provider import locate_tensor
from velo_chat.kernels.dequant import (
    GGML_TYPE_BF16,
    GGML_TYPE_F16,
    GGML_TYPE_F32,
    GGML_TYPE_IQ4_NL,
    GGML_TYPE_Q8_0,
    SUPPORTED_TYPES,
    check_rows,
    row_nbytes,
)
from velo_chat.kernels.ple_hash import PleHashSpec, ple_rows, ple_rows_from_prev, prev_tokens

M64 = (1 << 64) - 1
EOS = 2


def _spec(ngram: int = 4, per: int = 2) -> PleHashSpec:
    n_heads = (ngram - 1) * per
    return PleHashSpec(
        ngram_size=ngram,
        heads_per_ngram=per,
        eos_token_id=EOS,
        layer_multipliers=tuple((0x9E3779B97F4A7C15 * (j + 3)) & M64 for j in range(ngram)),
        head_offsets=tuple(1000 * h for h in range(n_heads)),
        head_vocab_sizes=tuple(997 - 2 * h for h in range(n_heads)),
    )


def _hand_rows(spec: PleHashSpec, window: list[int]) -> list[int]:
    """The C++ loop in plain Python ints, for one token whose window (nearest first) is given."""
    out = []
    for n in range(2, spec.ngram_size + 1):
        mixed = 0
        for j in range(n):
            mixed ^= (window[j] * spec.layer_multipliers[j]) & M64
        for g in range(spec.heads_per_ngram):
            h = (n - 2) * spec.heads_per_ngram + g
            out.append(mixed % spec.head_vocab_sizes[h] + spec.head_offsets[h])
    return out


def test_hash_hand_computed_case() -> None:
    spec = _spec()
    # tokens: 7 11 2(EOS) 13 17, one sequence from its start
    rows = ple_rows(spec, np.array([7, 11, EOS, 13, 17]))
    assert rows.dtype == np.int32 and rows.shape == (5, spec.n_heads)
    windows = [
        [7, EOS, EOS, EOS],  # nothing before the start: EOS
        [11, 7, EOS, EOS],
        [EOS, 11, 7, EOS],  # the token's own EOS does not cut its context
        [13, EOS, EOS, EOS],  # an EOS predecessor cuts everything at or before it
        [17, 13, EOS, EOS],
    ]
    for i, w in enumerate(windows):
        assert rows[i].tolist() == _hand_rows(spec, w), i
    # one worked value, written out: token 11 after 7, bigram head 0
    m0, m1 = spec.layer_multipliers[:2]
    assert rows[1, 0] == (((11 * m0) & M64) ^ ((7 * m1) & M64)) % 997


def test_hash_chunked_equals_single_shot() -> None:
    spec = _spec(ngram=5, per=3)
    rng = np.random.default_rng(5)
    toks = rng.integers(0, 20, size=200)
    whole = ple_rows(spec, toks)
    for cut in (1, 3, 4, 57, 199):
        part = ple_rows(spec, toks[cut:], history=toks[:cut])
        assert np.array_equal(part, whole[cut:])


def test_prev_tokens_matches_llama_layout() -> None:
    p = prev_tokens(np.array([5, 6]), 3, history=np.array([1, 2]))
    # oldest first, -1 (LLAMA_TOKEN_NULL) before the sequence start
    assert p.tolist() == [[-1, 1, 2], [1, 2, 5]]
    spec = _spec(ngram=4, per=1)
    assert np.array_equal(
        ple_rows_from_prev(spec, np.array([5, 6]), p), ple_rows(spec, np.array([5, 6]), np.array([1, 2]))
    )


def test_hash_spec_is_validated() -> None:
    with pytest.raises(ValueError, match="int32"):
        PleHashSpec(
            ngram_size=2,
            heads_per_ngram=1,
            eos_token_id=0,
            layer_multipliers=(1, 2),
            head_offsets=(2**31 - 10,),
            head_vocab_sizes=(20,),
        )
    with pytest.raises(ValueError, match="ngram_size"):
        PleHashSpec(
            ngram_size=9,
            heads_per_ngram=1,
            eos_token_id=0,
            layer_multipliers=(1,) * 9,
            head_offsets=(0,) * 8,
            head_vocab_sizes=(1,) * 8,
        )


def _f16_bytes(x: float) -> bytes:
    return np.float16(x).tobytes()


def test_dequant_hand_computed_blocks() -> None:
    q = np.arange(-16, 16, dtype=np.int8)
    q8 = _f16_bytes(0.5) + q.tobytes()
    assert dequantize_rows(np.frombuffer(q8, np.uint8), GGML_TYPE_Q8_0, 32)[0].tolist() == (q * 0.5).tolist()

    codes = np.arange(32) % 16
    qs = (codes[:16] | (codes[16:] << 4)).astype(np.uint8)  # low nibbles first, then high
    iq4 = _f16_bytes(-0.25) + qs.tobytes()
    want = (KVALUES_IQ4NL[codes].astype(np.float32) * np.float32(-0.25)).tolist()
    assert dequantize_rows(np.frombuffer(iq4, np.uint8), GGML_TYPE_IQ4_NL, 32)[0].tolist() == want

    vals = np.linspace(-3, 3, 32, dtype=np.float32)
    f16 = vals.astype(np.float16)
    assert np.array_equal(dequantize_rows(f16.view(np.uint8), GGML_TYPE_F16, 32)[0], f16.astype(np.float32))
    bf16 = (vals.view(np.uint32) >> 16).astype(np.uint16)
    got = dequantize_rows(bf16.view(np.uint8), GGML_TYPE_BF16, 32)[0]
    assert np.array_equal(got.view(np.uint32), vals.view(np.uint32) & 0xFFFF0000)
    assert np.array_equal(dequantize_rows(vals.view(np.uint8), GGML_TYPE_F32, 32)[0], vals)


def test_gather_layout_is_token_major_then_head() -> None:
    rng = np.random.default_rng(1)
    table = random_table(GGML_TYPE_Q8_0, 10, 64, rng)
    rows = np.array([[3, 9, 3], [0, 1, 2]])
    out = gather_dequant(table, GGML_TYPE_Q8_0, 64, rows)
    assert out.shape == (2, 3 * 64)
    for t in range(2):
        for h in range(3):
            seg = out[t, h * 64 : (h + 1) * 64]
            assert np.array_equal(seg, dequantize_rows(table[rows[t, h]], GGML_TYPE_Q8_0, 64)[0])


def test_rows_out_of_range_raise() -> None:
    with pytest.raises(IndexError, match="row index 10"):
        check_rows(np.array([0, 10]), 10)
    with pytest.raises(IndexError, match="row index -1"):
        gather_dequant(np.zeros((10, 68), np.uint8), GGML_TYPE_Q8_0, 64, np.array([[-1]]))
    with pytest.raises(ValueError, match="multiple of 32"):
        row_nbytes(GGML_TYPE_IQ4_NL, 48)


@pytest.mark.parametrize("ggml_type", SUPPORTED_TYPES)
def test_random_tables_are_finite(ggml_type: int) -> None:
    rng = np.random.default_rng(2)
    vals = dequantize_rows(random_table(ggml_type, 200, 64, rng), ggml_type, 64)
    assert np.isfinite(vals).all()
    assert len(np.unique(vals)) > 100  # not a constant pattern


def test_single_tensor_gguf_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    rng = np.random.default_rng(3)
    data = random_table(GGML_TYPE_IQ4_NL, 33, 160, rng)
    loc = write_single_tensor_gguf(path, "per_layer_token_embd.weight", GGML_TYPE_IQ4_NL, (160, 33))
    with open(path, "r+b") as f:
        f.seek(loc.offset)
        f.write(data.tobytes())
    found = locate_tensor(path, "per_layer_token_embd.weight")
    assert (found.offset, found.nbytes, found.n_rows, found.row_dim, found.row_bytes) == (
        loc.offset,
        33 * 90,
        33,
        160,
        90,
    )
    raw = np.fromfile(path, np.uint8, count=found.nbytes, offset=found.offset).reshape(33, 90)
    assert np.array_equal(raw, data)
    with pytest.raises(KeyError):
        locate_tensor(path, "nope")


def test_kernels_import_without_cupy_textual_or_the_engine() -> None:
    code = (
        "import sys\n"
        "import velo_chat.kernels.ple_table, velo_chat.kernels.cuda_kernels\n"
        "import velo_chat.kernels.ple_hash, velo_chat.kernels.gguf_tensor, velo_chat.kernels.cudart\n"
        "bad = [m for m in ('cupy', 'textual', 'llama_cpp', 'velo_chat.engine') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
