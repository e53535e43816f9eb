"""The full-width qwen4exp generator (`devkit/full_qwen4exp.py`): its shape table against the
published model and llama.cpp's loader, its random blocks against ggml's block formulas, and a
two-layer model written, loaded and run."""

from __future__ import annotations

import ctypes
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize

from devkit import full_qwen4exp as fq
from velo_chat.engine.config import build_profile
from velo_chat.engine.diagnostics import install_llama_log
from velo_chat.engine.fit import llama_buffers, read_facts
from velo_chat.engine.fit.compute import compute_bytes

llama_cpp = pytest.importorskip("llama_cpp.llama_cpp")

# Qwen's own breakdown of the checkpoint: the text model and the n-gram (PLE) table
PUBLISHED_PARAMS = 125_743_653_760 + 51_200_245_760
PUBLISHED_TENSORS = 1224  # a type census of unsloth's UD-IQ1_S GGUF
PUBLISHED_UD_Q4_K_XL_GIB = 103.7


def test_the_plan_at_full_depth_is_the_published_model() -> None:
    plan = fq.tensor_plan(48, 1.0)
    assert len(plan) == PUBLISHED_TENSORS
    assert sum(s.n_elements for s in plan) == PUBLISHED_PARAMS
    kinds = fq.layer_kinds(48)
    assert kinds.count("gdn") == 36 and kinds[3::4] == ("qsa",) * 12
    assert fq.ple_layer(kinds) == 1
    ple = plan[-1]
    assert (ple.name, ple.ne, ple.type) == (fq.PLE_TENSOR, (160, 320_001_536), T.IQ4_NL)
    assert sum(fq.ple_head_vocab(1.0)) == 320_001_446
    assert round(ple.nbytes / 2**30, 2) == 26.82
    types = Counter(s.type for s in plan)
    # the families the UD-IQ1_S census fixes; Q8_0 adds the 24 ffn_down_exps llama.cpp's Q4_K_M
    # rules give Q6_K (Q8_0 after the fallback for 640 columns)
    assert (types[T.F32], types[T.BF16], types[T.Q8_0], types[T.Q5_0]) == (557, 24, 244 + 24, 24)
    size_gib = sum(s.nbytes for s in plan) / 2**30
    assert 1.0 < size_gib / PUBLISHED_UD_Q4_K_XL_GIB < 1.03


@pytest.mark.parametrize("n_layer", [2, 4, 8, 12])
def test_a_scaled_model_keeps_every_layer_shape(n_layer: int) -> None:
    full = {s.name: s for s in fq.tensor_plan(48, 1.0)}
    plan = fq.tensor_plan(n_layer, 0.25)
    kinds = fq.layer_kinds(n_layer)
    assert kinds[-1] == "qsa" and kinds.count("qsa") == max(1, n_layer // 4)
    real_of_kind = {"gdn": 0, "qsa": 3}  # a real layer of each kind (layer 1 also has the PLE)
    for s in plan:
        if not s.name.startswith("blk.") or "ple_" in s.name:
            continue
        il = int(s.name.split(".")[1])
        twin = full[s.name.replace(f"blk.{il}.", f"blk.{real_of_kind[kinds[il]]}.", 1)]
        assert s.ne == twin.ne, s.name
        assert s.type == twin.type or s.name.endswith("ffn_down_exps.weight"), s.name
    downs = [s.type for s in plan if s.name.endswith("ffn_down_exps.weight")]
    assert downs.count(T.Q8_0) * 2 == n_layer  # half the layers, as at 48
    ple_rows = plan[-1].ne[1]
    assert 0.249 < ple_rows / 320_001_536 < 0.251


@pytest.mark.parametrize("qtype", [*fq.SCALES, T.F32, T.BF16])
def test_random_blocks_dequantize_to_finite_values_with_the_planned_spread(qtype: T) -> None:
    std = 0.0099  # 1/sqrt(10240): the smallest fan-in scale of the model
    raw = fq.job_bytes(fq.Job(0, qtype.name, "normal", std, 2048, (0, 1, 2)))
    values = dequantize(raw, qtype)
    assert np.isfinite(values).all()
    assert 0.95 < float(values.std()) / std < 1.05
    assert abs(float(values.mean())) < 0.15 * std
    again = fq.job_bytes(fq.Job(0, qtype.name, "normal", std, 2048, (0, 1, 2)))
    other = fq.job_bytes(fq.Job(0, qtype.name, "normal", std, 2048, (0, 1, 3)))
    assert np.array_equal(raw, again) and not np.array_equal(raw, other)


def test_constant_initialisations() -> None:
    ones = dequantize(fq.job_bytes(fq.Job(0, "F32", "ones", 0.0, 64, (0, 0, 0))), T.F32)
    ssm_a = dequantize(fq.job_bytes(fq.Job(0, "F32", "ssm_a", 0.0, 64, (0, 0, 0))), T.F32)
    assert (ones == 1).all()
    assert (ssm_a < 0).all() and (ssm_a >= -4).all()


def _load(path: Path, *, no_alloc: bool) -> ctypes.c_void_p | None:
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    if no_alloc:  # shapes and types only: llama.cpp reads no tensor data and maps nothing
        params.no_alloc = True
        params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
    model: ctypes.c_void_p | None = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    return model


@pytest.fixture(scope="module")
def tokenizer_gguf(smollm2_path: Path) -> Path:
    return smollm2_path


def _header_only(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_gguf: Path, n_layer: int, ple_fraction: float
) -> Iterator[Path]:
    """A full-width model whose data section is a sparse hole: its header, shapes and types."""
    path = tmp_path_factory.mktemp("full-qwen4exp") / f"header-{n_layer}.gguf"
    try:
        fq.write_full_qwen4exp(
            path, n_layer=n_layer, ple_fraction=ple_fraction, tokenizer_gguf=tokenizer_gguf, data=False
        )
        yield path
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def full_depth_header(tmp_path_factory: pytest.TempPathFactory, tokenizer_gguf: Path) -> Iterator[Path]:
    """All 48 layers and the whole PLE table: a 106 GiB file that is a sparse hole but its header."""
    yield from _header_only(tmp_path_factory, tokenizer_gguf, 48, 1.0)


def test_llama_cpp_accepts_every_shape_and_type_at_full_depth(full_depth_header: Path) -> None:
    model = _load(full_depth_header, no_alloc=True)
    assert model, "llama.cpp refused the plan (its log says which tensor)"
    try:
        assert llama_cpp.llama_model_n_params(model) == PUBLISHED_PARAMS
        assert llama_cpp.llama_model_size(model) == sum(s.nbytes for s in fq.tensor_plan(48, 1.0))
        assert llama_cpp.llama_model_n_layer(model) == 48
        assert llama_cpp.llama_model_n_embd(model) == fq.N_EMBD
        vocab = llama_cpp.llama_model_get_vocab(model)
        assert llama_cpp.llama_vocab_n_tokens(vocab) == fq.N_VOCAB
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = 4096, 512, 512
        ctx = llama_cpp.llama_init_from_model(model, params)  # reserves the graphs, allocates nothing
        assert ctx
        llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(model)


@pytest.fixture(scope="module")
def twelve_layer_header(tmp_path_factory: pytest.TempPathFactory, tokenizer_gguf: Path) -> Iterator[Path]:
    """The model the GPU machine measures (12 layers, a quarter of the PLE table), header only."""
    yield from _header_only(tmp_path_factory, tokenizer_gguf, 12, 0.25)


def _reserved_compute(model: ctypes.c_void_p, n_ctx: int, n_ubatch: int) -> int:
    """The compute buffer llama.cpp reserves for a context (no_alloc: sized, not allocated), its
    graph on the CPU (no op offload, so that a CUDA build sizes the same graph)."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, 512, n_ubatch
    params.flash_attn_type, params.op_offload = 1, False  # flash attention on
    with llama_buffers.captured() as got:
        ctx = llama_cpp.llama_init_from_model(model, params)
        assert ctx
        llama_cpp.llama_free(ctx)
    return sum(got.sizes("compute"))


def _compute_estimate(path: Path, n_ctx: int, n_ubatch: int, *, cuda: bool) -> int:
    context = {"n_ctx": n_ctx, "n_ubatch": n_ubatch, "n_batch": 512, "flash_attn": "on"}
    profile = build_profile("full", {"model": {"path": str(path)}, "context": context})
    return compute_bytes(profile, read_facts(path), n_ctx, cuda=cuda)[0]


@pytest.mark.parametrize("n_ctx", [131072, 262144])
def test_the_fit_estimate_of_the_compute_buffer_holds_at_full_width(
    full_depth_header: Path, n_ctx: int
) -> None:
    """At 128K and more the peak of the real model's graph is the sparse attention's scratch
    (about 13 B for each cached token and batch token); the tiny models never reach it."""
    install_llama_log()
    model = _load(full_depth_header, no_alloc=True)
    assert model
    try:
        for n_ubatch in (256, 512):
            measured = _reserved_compute(model, n_ctx, n_ubatch)
            estimated = _compute_estimate(full_depth_header, n_ctx, n_ubatch, cuda=False)
            assert abs(estimated / measured - 1) <= 0.05, (n_ubatch, estimated, measured)
    finally:
        llama_cpp.llama_model_free(model)


# What the CUDA build reserved on an H100 for the 12-layer model with every layer on the GPU,
# flash attention on (docs/results/scale.md, 2026-12-07, late night), MiB by (n_ubatch, n_ctx).
GPU_COMPUTE_AT_FULL_WIDTH_ON_AN_H100 = {
    (256, 65536): 257.77,
    (256, 131072): 466.52,
    (256, 196608): 675.27,
    (512, 65536): 514.79,
    (512, 131072): 931.54,
    (512, 196608): 1348.29,
}


def test_the_gpu_compute_estimate_at_full_width_matches_an_h100(twelve_layer_header: Path) -> None:
    for (n_ubatch, n_ctx), measured in GPU_COMPUTE_AT_FULL_WIDTH_ON_AN_H100.items():
        estimated = _compute_estimate(twelve_layer_header, n_ctx, n_ubatch, cuda=True) / 2**20
        assert abs(estimated / measured - 1) <= 0.05, (n_ubatch, n_ctx, estimated, measured)


def test_llama_cpp_refuses_a_plan_with_one_shape_wrong(
    tmp_path: Path, tokenizer_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: one routed-expert tensor a row short is refused."""
    real = fq.tensor_plan

    def off_by_one(n_layer: int, ple_fraction: float) -> list[fq.TensorSpec]:
        plan = real(n_layer, ple_fraction)
        i = next(i for i, s in enumerate(plan) if s.name == "blk.1.ffn_up_exps.weight")
        s = plan[i]
        plan[i] = fq.TensorSpec(s.name, (s.ne[0], s.ne[1] - 1, s.ne[2]), s.type, s.init, s.std)
        return plan

    monkeypatch.setattr(fq, "tensor_plan", off_by_one)
    path = tmp_path / "wrong.gguf"
    fq.write_full_qwen4exp(path, n_layer=2, ple_fraction=0.001, tokenizer_gguf=tokenizer_gguf, data=False)
    assert not _load(path, no_alloc=True)


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture
def two_layer_model(tmp_path: Path, tokenizer_gguf: Path) -> Iterator[tuple[Path, dict[str, object]]]:
    """One GDN and one QSA layer at full width: 4.4 GB, deleted after the test. Written only
    where `VELO_TEST_FULL_WIDTH=1` (the device scripts set it): a CI machine's disk and minutes
    are not for a 4 GB write, and the loader check above covers every shape without one."""
    if os.environ.get("VELO_TEST_FULL_WIDTH") != "1":
        pytest.skip("set VELO_TEST_FULL_WIDTH=1 to write and run a 4.4 GB two-layer model")
    if shutil.disk_usage(tmp_path).free < 10 * 2**30 or _mem_available() < 6 * 2**30:
        pytest.skip("needs 10 GiB of free disk and 6 GiB of free memory")
    path = tmp_path / "l2.gguf"
    try:
        result = fq.write_full_qwen4exp(
            path, n_layer=2, ple_fraction=0.001, tokenizer_gguf=tokenizer_gguf, threads=2
        )
        yield path, result
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_two_layer_model_is_written_loaded_and_run(two_layer_model: tuple[Path, dict[str, object]]) -> None:
    """Every tensor's first and last blocks hold what was planned, and llama.cpp decodes the
    model with finite logits."""
    path, result = two_layer_model
    assert path.stat().st_size == result["file_bytes"]
    plan = {s.name: s for s in fq.tensor_plan(2, 0.001)}
    reader = GGUFReader(path)
    assert [t.name for t in reader.tensors] == list(plan)
    for t in reader.tensors:
        spec = plan[t.name]
        assert t.tensor_type == spec.type, t.name
        flat = np.asarray(t.data).reshape(-1).view(np.uint8)
        size = fq.GGML_QUANT_SIZES[spec.type][1]
        edge = min(flat.size, 64 * size)  # whole blocks from each end of the tensor
        for piece in (flat[:edge], flat[-edge:]):
            values = dequantize(np.array(piece), spec.type)
            assert np.isfinite(values).all(), t.name
            if spec.init == "ones":
                assert (values == 1).all(), t.name
            elif spec.init == "normal" and values.size >= 2048:
                assert 0.7 < float(values.std()) / spec.std < 1.4, t.name
    del reader

    model = _load(path, no_alloc=False)
    assert model
    try:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = 256, 64, 64
        params.n_threads = params.n_threads_batch = 2
        ctx = llama_cpp.llama_init_from_model(model, params)
        assert ctx
        n_vocab = fq.N_VOCAB
        tokens = [1, 504, 3458, 282, 253, 1377, 30, 2000, 248_000, 120_000]  # padded ids too
        logits_seen = []
        for step in range(4):
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens))) == 0
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            assert np.isfinite(logits).all(), f"step {step}"
            logits_seen.append(logits.copy())
            tokens = [int(np.argmax(logits))]
        assert all(float(x.std()) > 0 for x in logits_seen)
        assert not np.array_equal(logits_seen[0], logits_seen[1])
        llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(model)
