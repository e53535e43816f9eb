"""The PLE provider patch (packaging/patches/ple-provider.patch) and the engine's GPU PLE gather.

On every build (CI is CPU only): the patched llama.cpp exports `llama_model_set_ple_provider`,
and a registered provider is inert where no GPU backend holds the PLE layer: never called, same
greedy tokens, graphs still reused. The engine resolves `ple_gather` to "stock" there and says why.

On a CUDA build with CuPy (`gpu` marker, run on the device machine): greedy tokens and logits of
the tiny qwen4exp are the same with llama.cpp's CPU gather and with the provider, for every PLE
table type, after a 64- and a 512-token prefill and over single-token decode; decode graphs are
reused; a decode step has one graph split fewer with the provider (the CPU split of the input
embeddings is gone); a provider that reads one row off
changes the logits (so the comparison can fail), and one that reads outside the table fails the
decode with an error instead of aborting or hanging. Each of these holds for both halves of the
provider: the Python callback (prefill-sized gathers) and the C launch the patch adds
(decode-sized gathers), which is checked to have done every decode step.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest

from tests.support.engine_helpers import test_profile
from velo_chat.engine.fit import machine
from velo_chat.engine.llama import gguf_file, ple_provider
from velo_chat.engine.llama.context import DecodeError, LlamaContext
from velo_chat.engine.llama.model import LlamaModel

ll = pytest.importorskip("llama_cpp.llama_cpp")

try:  # the generator needs the gguf package, which the GPU machine lacks (it has prebuilt models)
    from devkit.tiny_qwen4exp import PLE_TYPES
except ImportError:
    PLE_TYPES = ("f32", "f16", "bf16", "q8_0", "iq4_nl")


# -- every build --------------------------------------------------------------------------------


def test_provider_api_is_exported() -> None:
    """The patched build exports the setter, and the engine finds it through ctypes."""
    assert hasattr(ll._lib, "llama_model_set_ple_provider")
    assert ple_provider.provider_symbol() is not None


class _CountingProvider:
    """A provider that counts its calls and fails if it is ever called."""

    def __init__(self) -> None:
        self.calls = 0
        self.fn = ple_provider.PROVIDER_FN(self._call)

    def _call(self, _args, _ud) -> bool:
        self.calls += 1
        return True  # (the destination is left unwritten: the tokens would change)


def _greedy(model_ptr, prompt: list[int], n_new: int) -> tuple[list[int], int]:
    """Greedy tokens after `prompt` in a fresh one-thread context, and the graphs reused."""
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 256, 256
    cp.n_threads = cp.n_threads_batch = 1
    cp.no_perf = False
    ctx = ll.llama_init_from_model(model_ptr, cp)
    assert ctx
    sampler = ll.llama_sampler_init_greedy()
    try:
        arr = (ll.llama_token * len(prompt))(*prompt)
        assert ll.llama_decode(ctx, ll.llama_batch_get_one(arr, len(prompt))) == 0
        out: list[int] = []
        one = (ll.llama_token * 1)()
        for _ in range(n_new):
            tok = ll.llama_sampler_sample(sampler, ctx, -1)
            out.append(tok)
            one[0] = tok
            assert ll.llama_decode(ctx, ll.llama_batch_get_one(one, 1)) == 0
        return out, int(ll.llama_perf_context(ctx).n_reused)
    finally:
        ll.llama_sampler_free(sampler)
        ll.llama_free(ctx)


def test_registered_provider_is_inert_without_a_gpu_layer(qwen_path: Path) -> None:
    """With every layer on the CPU the stock gather runs even with a provider registered: the
    provider is never called, the greedy tokens are those of the same build without one, and
    decode graphs are still reused (the PLE input's can_reuse with a provider set)."""
    params = ll.llama_model_default_params()
    params.n_gpu_layers = 0
    model = ll.llama_model_load_from_file(str(qwen_path).encode(), params)
    assert model
    try:
        prompt = [int(t) for t in np.random.default_rng(7).integers(100, 8000, size=40)]
        expected, reused_stock = _greedy(model, prompt, 24)
        assert len(set(expected)) > 3  # varied text, so a changed embedding would show
        provider = _CountingProvider()
        set_provider = ple_provider.provider_symbol()
        set_provider(model, provider.fn, None)
        try:
            got, reused = _greedy(model, prompt, 24)
        finally:
            set_provider(model, ple_provider.PROVIDER_FN(), None)
        assert provider.calls == 0
        assert got == expected
        assert reused >= 20 and reused == reused_stock
    finally:
        ll.llama_model_free(model)


def test_plan_says_why_it_runs_stock(qwen_path: Path, smollm2_path: Path, caplog) -> None:
    qwen = gguf_file.read_header(qwen_path)
    assert ple_provider.plan("auto", gguf_file.read_header(smollm2_path), -1).reason == (
        "the model has no PLE table"
    )
    assert ple_provider.plan("stock", qwen, -1) == ple_provider.PlePlan("stock", "ple_gather = stock")
    cpu_only = ple_provider.plan("auto", qwen, 0)
    assert (cpu_only.mode, cpu_only.reason) == ("stock", "no layers on the GPU (n_gpu_layers = 0)")
    if ple_provider.cuda_buffer_type() is None:  # a CPU build: asking for the GPU logs why not
        with caplog.at_level(logging.WARNING, logger="velo_chat.engine.llama.ple_provider"):
            forced = ple_provider.plan("gpu", qwen, -1)
        assert forced.mode == "stock" and "no CUDA device" in forced.reason
        assert any("no CUDA device" in r.getMessage() for r in caplog.records)


def test_engine_reports_the_ple_mode(qwen_path: Path, smollm2_path: Path) -> None:
    from velo_chat.engine.engine import Engine

    for path, reason in ((qwen_path, None), (smollm2_path, "the model has no PLE table")):
        engine = Engine(test_profile(path, model={"n_gpu_layers": 0}))
        try:
            info = engine.load()
        finally:
            engine.close()
        assert info.ple is not None and info.local is not None
        assert info.ple.gather == "stock"
        assert info.ple.reason == (reason or "no layers on the GPU (n_gpu_layers = 0)")
        assert info.ple.table == (reason is None)
        # A CUDA build takes an op that reads a weight from the host onto the GPU when the op
        # has 32 rows or more (op offload), also in a one-token decode step. qwen4exp's step has
        # such ops (3 splits on an H100); SmolLM2's has none, so it stays one split, as on a
        # build without a GPU: one backend, one split.
        if machine.probe().gpu_offload and reason is None:
            assert info.local.graph_splits > 1
        else:
            assert info.local.graph_splits == 1


# -- CUDA build with CuPy -----------------------------------------------------------------------


def _gpu_ready() -> bool:
    if ple_provider.cuda_buffer_type() is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="module")
def ple_models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny qwen4exp with each PLE table type (identical other weights). `VELO_TEST_PLE_MODELS`
    names a folder of prebuilt ones, `tiny-qwen4exp-<type>.gguf` (the GPU machine cannot fetch
    SmolLM2's tokenizer)."""
    prebuilt = os.environ.get("VELO_TEST_PLE_MODELS")
    if prebuilt:
        return {t: Path(prebuilt) / f"tiny-qwen4exp-{t}.gguf" for t in PLE_TYPES}
    from devkit.tiny_qwen4exp import tiny_qwen4exp_path

    smollm2 = request.getfixturevalue("smollm2_path")
    cache = tmp_path_factory.mktemp("tiny-ple-types")
    return {t: tiny_qwen4exp_path(cache, smollm2, ple_type=t) for t in PLE_TYPES}


class _Run:
    def __init__(self, tokens, logits, last_logits, reused, splits, gathers, python_calls) -> None:
        self.tokens, self.logits, self.last_logits, self.reused = tokens, logits, last_logits, reused
        self.splits, self.gathers, self.python_calls = splits, gathers, python_calls


SPLITS = re.compile(r"graph.*splits = (\d+)(?: / (\d+))?")


def _load(path: Path, mode: str):
    """The GPU profile both runs use, and the model loaded on the `mode` PLE path."""
    profile = test_profile(
        path,
        model={"n_gpu_layers": -1, "ple_gather": mode},
        context={"n_ctx": 2048, "n_batch": 512, "n_ubatch": 512, "n_threads": 1, "n_threads_batch": 1},
    )
    model = LlamaModel(path, profile.model)
    if model.ple_mode != mode:
        model.close()
        raise AssertionError(model.ple_reason)
    return profile, model


def _run(path: Path, mode: str, n_prompt: int, n_new: int, caplog, plant=None) -> _Run:
    """Prefill `n_prompt` random tokens in one ubatch, then `n_new` greedy single-token steps,
    every layer on the GPU. `plant(provider)`: a bug planted in the loaded provider."""
    profile, model = _load(path, mode)
    try:
        if plant is not None:
            plant(model.ple)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="velo_chat.llama"):
            ctx = LlamaContext(model, profile.context, n_gpu_layers=-1)
        found = [SPLITS.search(r.getMessage()) for r in caplog.records]
        m = [x for x in found if x][-1]
        splits_tg = int(m.group(2) or m.group(1))
        try:
            prompt = [int(t) for t in np.random.default_rng(n_prompt).integers(100, 8000, size=n_prompt)]
            ctx.decode(prompt)
            logits = np.ctypeslib.as_array(
                ll.llama_get_logits_ith(ctx.ctx, -1), shape=(model.n_vocab,)
            ).copy()
            tokens: list[int] = []
            for _ in range(n_new):
                lg = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx.ctx, -1), shape=(model.n_vocab,))
                tokens.append(int(np.argmax(lg)))
                ctx.decode([tokens[-1]])
            ctx.synchronize()
            last = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx.ctx, -1), shape=(model.n_vocab,)).copy()
            reused = ctx.perf().n_reused
        finally:
            ctx.close()
        ple = model.ple
        gathers, calls = (ple.launches, ple.calls) if ple else (0, 0)
        return _Run(tokens, logits, last, reused, splits_tg, gathers, calls)
    finally:
        model.close()


@pytest.mark.gpu
@pytest.mark.parametrize("n_prompt", [64, 512])
@pytest.mark.parametrize("ple_type", PLE_TYPES)
def test_provider_matches_stock(ple_models, ple_type: str, n_prompt: int, caplog) -> None:
    if not _gpu_ready():
        pytest.skip("needs a CUDA build and CuPy")
    n_new = 48
    stock = _run(ple_models[ple_type], "stock", n_prompt, n_new, caplog)
    gpu_run = _run(ple_models[ple_type], "gpu", n_prompt, n_new, caplog)
    assert gpu_run.gathers == 1 + n_new  # one prefill ubatch, then one per token
    if ple_provider.native_launch_address() is not None:
        assert gpu_run.python_calls == 1  # the prefill; every decode step launched from C
    assert gpu_run.tokens == stock.tokens
    assert len(set(stock.tokens)) > 3
    np.testing.assert_allclose(gpu_run.logits, stock.logits, rtol=0, atol=1e-4)
    np.testing.assert_allclose(gpu_run.last_logits, stock.last_logits, rtol=0, atol=1e-4)
    # the CPU split of the token embedding and PLE rows is gone (the tiny model's other ops still
    # split its decode graph: 10 splits stock, 9 with the provider on the H200)
    assert gpu_run.splits == stock.splits - 1
    assert gpu_run.reused >= 0.95 * (n_new - 1)


@pytest.mark.gpu
def test_planted_off_by_one_row_is_caught(ple_models, caplog) -> None:
    """The comparison above can fail: reading each head's next row changes the logits."""
    if not _gpu_ready():
        pytest.skip("needs a CUDA build and CuPy")
    path = ple_models["iq4_nl"]
    stock = _run(path, "stock", 64, 4, caplog)

    def off_by_one(self, a):
        return (ple_provider.PleProvider._rows(self, a) + 1) % self.table.n_rows

    bad = _run(path, "gpu", 64, 4, caplog, plant=lambda p: setattr(p, "_rows", off_by_one.__get__(p)))
    assert np.abs(bad.logits - stock.logits).max() > 1e-3


@pytest.mark.gpu
def test_planted_off_by_one_row_in_the_c_launch_is_caught(ple_models, caplog) -> None:
    """The same for decode steps launched from C: its table address one row on (and one row
    fewer, so the shifted table stays inside the mapping) changes the decode logits."""
    if not _gpu_ready() or ple_provider.native_launch_address() is None:
        pytest.skip("needs a CUDA build with the C launch, and CuPy")
    path = ple_models["iq4_nl"]
    stock = _run(path, "gpu", 64, 4, caplog)

    def shift(p) -> None:
        p.native.table += p.native.row_bytes
        p.native.n_table_rows -= 1

    bad = _run(path, "gpu", 64, 4, caplog, plant=shift)
    np.testing.assert_array_equal(bad.logits, stock.logits)  # the prefill went through Python
    assert np.abs(bad.last_logits - stock.last_logits).max() > 1e-3


@pytest.mark.gpu
def test_bad_row_id_fails_the_decode(ple_models, caplog) -> None:
    """A row outside the table is caught before any read and surfaces as a DecodeError."""
    if not _gpu_ready():
        pytest.skip("needs a CUDA build and CuPy")

    def outside(self, a):
        return ple_provider.PleProvider._rows(self, a) + self.table.n_rows

    with pytest.raises(DecodeError, match="outside the table"):
        _run(
            ple_models["q8_0"], "gpu", 64, 2, caplog, plant=lambda p: setattr(p, "_rows", outside.__get__(p))
        )


@pytest.mark.gpu
def test_bad_row_id_fails_the_decode_in_the_c_launch(ple_models, caplog) -> None:
    """A row the C launch refuses (its table said to be one row long) fails the decode step."""
    if not _gpu_ready() or ple_provider.native_launch_address() is None:
        pytest.skip("needs a CUDA build with the C launch, and CuPy")

    def one_row(p) -> None:
        p.native.n_table_rows = 1

    with pytest.raises(DecodeError, match="outside the table of 1 rows"):
        _run(ple_models["q8_0"], "gpu", 64, 2, caplog, plant=one_row)


def _greedy_after(path: Path, mode: str, head: list[int], tail: list[int], n_new: int, state=None):
    """Decode `head` (or restore `state`, saved after it), then `tail` in one batch, then
    `n_new` greedy tokens on the `mode` path. Returns (state after head, tokens, last logits)."""
    profile, model = _load(path, mode)
    try:
        ctx = LlamaContext(model, profile.context, n_gpu_layers=-1)
        try:
            if state is None:
                ctx.decode(head)
            else:
                assert ctx.set_state(state)
                assert ctx.pos_max() == len(head) - 1
            saved = ctx.get_state().copy()
            ctx.decode(tail)
            tokens: list[int] = []
            for _ in range(n_new):
                tokens.append(int(np.argmax(ctx.logits_at(-1))))
                ctx.decode([tokens[-1]])
            return saved, tokens, ctx.logits_at(-1).copy()
        finally:
            ctx.close()
    finally:
        model.close()


@pytest.mark.gpu
def test_checkpoints_move_between_the_stock_and_the_provider_path(ple_models) -> None:
    """The checkpoint layout does not name the PLE path, so a state saved on one path must resume
    on the other: the saved state holds the KV and recurrent state, which the two paths compute
    the same. Checked both ways against an uninterrupted run, tokens and logits."""
    if not _gpu_ready():
        pytest.skip("needs a CUDA build and CuPy")
    path = ple_models["iq4_nl"]
    rng = np.random.default_rng(7)
    head = [int(t) for t in rng.integers(100, 8000, size=96)]
    tail = [int(t) for t in rng.integers(100, 8000, size=9)]
    runs = {}
    for mode in ("stock", "gpu"):
        runs[mode] = _greedy_after(path, mode, head, tail, 24)
    assert runs["stock"][1] == runs["gpu"][1]
    assert len(set(runs["stock"][1])) > 3
    for saved_on, resumed_on in (("stock", "gpu"), ("gpu", "stock")):
        _, tokens, logits = _greedy_after(path, resumed_on, head, tail, 24, state=runs[saved_on][0])
        assert tokens == runs[resumed_on][1], (saved_on, resumed_on)
        np.testing.assert_allclose(logits, runs[resumed_on][2], rtol=0, atol=1e-4)
