"""The PLE references against llama.cpp itself: hash + gather + dequant, bit for bit.

llama.cpp runs the tiny qwen4exp model on the CPU with an eval callback (`cb_eval`) that copies
out the graph tensor named `ple_embd` (the `ggml_get_rows` result after the reshape in
`build_inp_ple`) for every ubatch. The references must reproduce it exactly:
- with a table whose rows encode their own index, the decoded rows are the reference hash;
- with random tables of every type, the reference hash + gather + dequant give the same bits;
over prompts with EOS at the start, inside and at the end of the n-gram window, in one batch and
in a chunked prefill (several decode calls, small ubatches).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from devkit.ple_reference import gather_dequant, table_view
from devkit.tiny_qwen4exp import PLE_TYPES, decode_index_rows, tiny_qwen4exp_path
from velo_chat.engine.llama.gguf_file import read_header
from velo_chat.engine.llama.ple_provider import locate_tensor
from velo_chat.kernels.dequant import ggml_type_id
from velo_chat.kernels.ple_hash import PleHashSpec, ple_rows

ll = pytest.importorskip("llama_cpp.llama_cpp")

EOS = 2  # SmolLM2's <|im_end|>, the tiny model's ple.eos_token_id


class _GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` (vendored ggml/include/ggml.h): only name, type, ne, nb, data are read."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


class TensorCapture:
    """A CPU llama.cpp context whose eval callback copies every computed tensor named `name`."""

    def __init__(self, model_path: Path, name: str, n_ubatch: int, n_ctx: int = 512) -> None:
        from velo_chat.engine.llama import log as llama_log

        llama_log.install()
        self.name = name.encode()
        self.captured: list[np.ndarray] = []
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = ll.llama_model_load_from_file(str(model_path).encode(), mp)
        assert self.model, f"llama.cpp could not load {model_path}"
        cp = ll.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_ctx, n_ubatch
        cp.n_threads = cp.n_threads_batch = 1
        self._cb = ll.ggml_backend_sched_eval_callback(self._on_eval)  # kept alive with self
        cp.cb_eval, cp.cb_eval_user_data = self._cb, None
        self.ctx = ll.llama_init_from_model(self.model, cp)
        assert self.ctx

    def _on_eval(self, t: int, ask: bool, _user: int) -> bool:
        tensor = _GgmlTensor.from_address(t)
        if ask:
            return tensor.name == self.name
        try:
            assert tensor.type == 0, "captured tensor is not F32"
            ne0, ne1 = tensor.ne[0], tensor.ne[1]
            assert tensor.nb[1] == ne0 * 4 and tensor.ne[2] == tensor.ne[3] == 1, "not contiguous 2-D"
            data = np.ctypeslib.as_array((ctypes.c_float * (ne0 * ne1)).from_address(tensor.data))
            self.captured.append(data.reshape(ne1, ne0).copy())
        except AssertionError as exc:  # never raise into C; fail the test afterwards
            self.captured.append(np.array([str(exc)]))
        return True

    def run(self, tokens: list[int], chunk: int | None = None) -> np.ndarray:
        """Decode `tokens` from an empty sequence (in calls of `chunk` tokens); the captured rows."""
        ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
        self.captured.clear()
        step = chunk or len(tokens)
        for i in range(0, len(tokens), step):
            part = tokens[i : i + step]
            arr = (ll.llama_token * len(part))(*part)
            assert ll.llama_decode(self.ctx, ll.llama_batch_get_one(arr, len(part))) == 0
        bad = [c for c in self.captured if c.dtype.kind == "U"]
        assert not bad, bad[0]
        return np.concatenate(self.captured)

    def close(self) -> None:
        ll.llama_free(self.ctx)
        ll.llama_model_free(self.model)


def _prompts(n_vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    body = [int(x) for x in rng.integers(3, n_vocab, size=40)]
    return [
        body,  # no EOS: the window starts with "missing" (EOS) predecessors only
        [EOS] + body[:10],  # EOS first
        body[:5] + [EOS] + body[5:12] + [EOS, EOS] + body[12:20] + [EOS],  # EOS in and at the end
        [body[0], EOS, body[1], body[2], EOS, body[3]] * 4,  # EOS every few tokens
    ]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ple-models")


@pytest.fixture(scope="module")
def index_model(cache_dir: Path, smollm2_path: Path) -> Path:
    """F32 table whose rows encode their index; n-gram 5, 4 heads of 32 values."""
    return tiny_qwen4exp_path(
        cache_dir,
        smollm2_path,
        ple_type="f32",
        ple_rows_encode_index=True,
        n_embd=128,
        ple_ngram_size=5,
        ple_heads_per_ngram=1,
    )


def _spec(path: Path) -> PleHashSpec:
    """The hash spec from the model's `<arch>.ple.*` keys (its header, arrays kept)."""
    return PleHashSpec.from_metadata(read_header(path, keep_arrays=True).metadata)


@pytest.fixture(scope="module")
def index_capture(index_model: Path) -> Iterator[TensorCapture]:
    cap = TensorCapture(index_model, "ple_embd", n_ubatch=5)
    yield cap
    cap.close()


def test_spec_is_read_from_the_gguf(index_model: Path) -> None:
    spec = _spec(index_model)
    assert spec.ngram_size == 5 and spec.n_heads == 4 and spec.eos_token_id == EOS
    assert spec.min_table_rows <= locate_tensor(index_model, "per_layer_token_embd.weight").n_rows


@pytest.mark.parametrize("chunk", [None, 3])
def test_hash_reproduces_llama_cpp(
    index_model: Path, index_capture: TensorCapture, chunk: int | None
) -> None:
    spec = _spec(index_model)
    loc = locate_tensor(index_model, "per_layer_token_embd.weight")
    table = table_view(
        np.fromfile(index_model, np.uint8, count=loc.nbytes, offset=loc.offset), loc.ggml_type, loc.row_dim
    )
    for tokens in _prompts(8192):
        got = index_capture.run(tokens, chunk)
        assert got.shape == (len(tokens), spec.n_heads * loc.row_dim)
        rows = ple_rows(spec, np.array(tokens))
        decoded = decode_index_rows(got.reshape(len(tokens), spec.n_heads, loc.row_dim))
        np.testing.assert_array_equal(decoded, rows)
        ref = gather_dequant(table, loc.ggml_type, loc.row_dim, rows)
        assert np.array_equal(ref.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("ple_type", PLE_TYPES)
def test_dequant_reproduces_llama_cpp_get_rows(cache_dir: Path, smollm2_path: Path, ple_type: str) -> None:
    path = tiny_qwen4exp_path(cache_dir, smollm2_path, ple_type=ple_type)
    spec = _spec(path)
    loc = locate_tensor(path, "per_layer_token_embd.weight")
    assert loc.ggml_type == ggml_type_id(ple_type)
    table = table_view(
        np.fromfile(path, np.uint8, count=loc.nbytes, offset=loc.offset), loc.ggml_type, loc.row_dim
    )
    cap = TensorCapture(path, "ple_embd", n_ubatch=7)
    try:
        for tokens in _prompts(8192)[1:3]:
            for chunk in (None, 4):
                got = cap.run(tokens, chunk)
                ref = gather_dequant(table, loc.ggml_type, loc.row_dim, ple_rows(spec, np.array(tokens)))
                assert np.array_equal(ref.view(np.uint32), got.view(np.uint32)), (ple_type, chunk)
    finally:
        cap.close()


def test_q8_0_reference_matches_smollm2_token_embd(smollm2_path: Path) -> None:
    """A real, converter-written Q8_0 tensor: llama.cpp's token-embedding get_rows ("embd")."""
    loc = locate_tensor(smollm2_path, "token_embd.weight")
    if loc.type_name != "q8_0":
        pytest.skip(f"token_embd is {loc.type_name} in this SmolLM2 file")
    table = table_view(
        np.memmap(smollm2_path, np.uint8, mode="r", offset=loc.offset, shape=(loc.nbytes,)),
        loc.ggml_type,
        loc.row_dim,
    )
    tokens = [1, 2, 17, 49151, 300, 17]
    cap = TensorCapture(smollm2_path, "embd", n_ubatch=64, n_ctx=64)
    try:
        got = cap.run(tokens)
    finally:
        cap.close()
    ref = gather_dequant(table, loc.ggml_type, loc.row_dim, np.array(tokens)[:, None])
    assert np.array_equal(ref.view(np.uint32), got.view(np.uint32))
