"""The generated tiny qwen4exp model: llama.cpp loads it as a hybrid model and generates from it."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

from devkit.tiny_qwen4exp import (
    PLE_TYPES,
    decode_index_rows,
    read_tiny_qwen4exp_spec,
    tiny_qwen4exp_path,
)

llama_cpp = pytest.importorskip("llama_cpp.llama_cpp")

PROMPT = (
    "<|im_start|>user\nWrite a short poem about the sea and the ships that sail on it, "
    "in the evening light.<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def tokenizer_gguf(smollm2_path: Path) -> Path:
    """SmolLM2's GGUF (conftest.py) is where the tokenizer and chat template are copied from."""
    return smollm2_path


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-qwen4exp-cache")


@pytest.fixture(scope="module")
def default_model(cache_dir: Path, tokenizer_gguf: Path) -> Path:
    return tiny_qwen4exp_path(cache_dir, tokenizer_gguf)


class _Model:
    """Just enough of the low-level API to load, tokenize and decode greedily."""

    def __init__(self, path: Path) -> None:
        llama_cpp.llama_backend_init()
        self.ptr = llama_cpp.llama_model_load_from_file(
            str(path).encode(), llama_cpp.llama_model_default_params()
        )
        assert self.ptr, f"llama.cpp could not load {path}"
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)

    def close(self) -> None:
        llama_cpp.llama_model_free(self.ptr)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (llama_cpp.llama_token * (len(raw) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), False, True)
        assert n > 0
        return list(buf[:n])

    def detokenize(self, tokens: list[int]) -> str:
        out = ctypes.create_string_buffer(16 * len(tokens) + 16)
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(tokens), out, len(out), False, True)
        assert n >= 0
        return out.raw[:n].decode()

    def greedy(self, prompt: list[int], n_new: int) -> list[int]:
        """Greedy continuation in a fresh context (one thread: deterministic and fast here)."""
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 256, 256, 256
        cp.n_threads = cp.n_threads_batch = 1
        ctx = llama_cpp.llama_init_from_model(self.ptr, cp)
        assert ctx
        sampler = llama_cpp.llama_sampler_init_greedy()
        try:
            arr = (llama_cpp.llama_token * len(prompt))(*prompt)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(prompt))) == 0
            out: list[int] = []
            for _ in range(n_new):
                tok = llama_cpp.llama_sampler_sample(sampler, ctx, -1)
                out.append(tok)
                one = (llama_cpp.llama_token * 1)(tok)
                assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) == 0
            return out
        finally:
            llama_cpp.llama_sampler_free(sampler)
            llama_cpp.llama_free(ctx)


@pytest.fixture(scope="module")
def model(default_model: Path):
    m = _Model(default_model)
    yield m
    m.close()


def test_small_and_hybrid(default_model: Path, model: _Model) -> None:
    assert default_model.stat().st_size < 20 * 2**20
    assert llama_cpp.llama_model_is_hybrid(model.ptr) or llama_cpp.llama_model_is_recurrent(model.ptr)
    assert llama_cpp.llama_vocab_n_tokens(model.vocab) == 8192


def test_greedy_is_deterministic_and_varied(model: _Model) -> None:
    prompt = model.tokenize(PROMPT)
    assert len(prompt) > 20  # past indexer_top_k + compress ratio: the QSA selection is sparse
    first = model.greedy(prompt, 32)
    assert model.greedy(prompt, 32) == first
    assert len(set(first)) > 8, first  # varied text, not one token repeated
    assert first[:4] != prompt[-4:]  # not an echo of the input


def test_trimmed_tokenizer_round_trips(model: _Model) -> None:
    text = "<|im_start|>user\nNaïve café, 日本語 and emoji 🙂 — ok?<|im_end|>\n"
    tokens = model.tokenize(text)
    assert all(0 <= t < 8192 for t in tokens)
    assert model.tokenize("<|im_end|>") == [2]
    assert model.detokenize(tokens) == text


def test_spec_matches_llama_cpp_constraints(default_model: Path) -> None:
    spec = read_tiny_qwen4exp_spec(default_model)
    ple = spec.ple
    assert spec.recurrent_layers[ple.layer]  # PLE must sit on a GDN layer
    assert ple.row_dim * ple.n_heads == spec.n_embd
    assert len(ple.layer_multipliers) == ple.ngram_size
    assert max(o + v for o, v in zip(ple.head_offsets, ple.head_vocab_sizes, strict=True)) <= ple.n_rows
    assert ple.eos_token_id == 2  # SmolLM2's <|im_end|>
    assert spec.compress_ratios == (0, 0, 0, 4)
    fields = GGUFReader(default_model).fields
    for name in ("layer_multipliers", "head_offsets", "head_vocab_sizes"):
        assert fields[f"qwen4exp.ple.{name}"].types == [GGUFValueType.ARRAY, GGUFValueType.UINT64]


def test_cache_builds_once(cache_dir: Path, tokenizer_gguf: Path, default_model: Path) -> None:
    mtime = default_model.stat().st_mtime_ns
    assert tiny_qwen4exp_path(cache_dir, tokenizer_gguf) == default_model
    assert default_model.stat().st_mtime_ns == mtime
    other = tiny_qwen4exp_path(cache_dir, tokenizer_gguf, seed=1)
    assert other != default_model
    assert not list(cache_dir.glob("*.partial"))


def _ple_values(path: Path) -> tuple[str, np.ndarray]:
    t = next(t for t in GGUFReader(path).tensors if t.name == "per_layer_token_embd.weight")
    values = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
    return t.tensor_type.name.lower(), values.reshape(int(t.shape[1]), int(t.shape[0]))


@pytest.mark.parametrize("encode_index", [False, True], ids=["random", "index"])
@pytest.mark.parametrize("ple_type", PLE_TYPES)
def test_ple_table_types(cache_dir: Path, tokenizer_gguf: Path, ple_type: str, encode_index: bool) -> None:
    path = tiny_qwen4exp_path(
        cache_dir, tokenizer_gguf, ple_type=ple_type, ple_rows_encode_index=encode_index
    )
    stored_type, values = _ple_values(path)
    assert stored_type == ple_type
    assert read_tiny_qwen4exp_spec(path).ple.table_type == ple_type
    if encode_index:
        np.testing.assert_array_equal(decode_index_rows(values), np.arange(values.shape[0]))
    m = _Model(path)
    try:
        out = m.greedy(m.tokenize(PROMPT), 4)
    finally:
        m.close()
    assert all(0 <= t < 8192 for t in out)
