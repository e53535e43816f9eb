"""GPU tests of the PLE kernels and PleTable: bit-exact against the numpy references.

Run on the device machine (`pytest -m gpu`); skipped where CuPy or a CUDA device is missing.
Every run draws fresh random tables, specs and rows (the seed is printed on failure), poisons the
outputs first, and compares bits, not values. The >8 GiB table is made sparse in a temp dir (or
taken from $VELO_PLE_BIG_TABLE), with fresh random data written into every row the test reads.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import numpy as np
import pytest

from devkit.ple_reference import gather_dequant, random_table, write_single_tensor_gguf
from velo_chat.engine.llama.ple_provider import locate_tensor
from velo_chat.kernels import cudart
from velo_chat.kernels.dequant import GGML_TYPE_IQ4_NL, SUPPORTED_TYPES, row_nbytes
from velo_chat.kernels.ple_hash import PleHashSpec, ple_rows, ple_rows_from_prev, prev_tokens

pytestmark = pytest.mark.gpu

if not cudart.cuda_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs CuPy and a CUDA device", allow_module_level=True)

import cupy  # noqa: E402

from velo_chat.kernels.cuda_kernels import DeviceHashSpec  # noqa: E402
from velo_chat.kernels.ple_table import MODES, PleTable, PleTableError  # noqa: E402

PLE = "per_layer_token_embd.weight"
N_HEADS = 16
BIG_ROWS = 96_000_000  # x 90 bytes (160-value IQ4_NL rows) = 8.05 GiB


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    seed = secrets.randbits(32)
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def _random_spec(rng: np.random.Generator, n_table_rows: int) -> PleHashSpec:
    ngram = int(rng.integers(2, 9))
    per = int(rng.integers(1, 64 // (ngram - 1) + 1))
    n_heads = (ngram - 1) * per
    vocab = rng.integers(1, n_table_rows // n_heads + 1, size=n_heads)
    offs = [int(rng.integers(0, n_table_rows - v + 1)) for v in vocab]
    return PleHashSpec(
        ngram_size=ngram,
        heads_per_ngram=per,
        eos_token_id=int(rng.integers(0, 50)),
        layer_multipliers=tuple(int(x) for x in rng.integers(0, 2**64, size=ngram, dtype=np.uint64)),
        head_offsets=tuple(offs),
        head_vocab_sizes=tuple(int(v) for v in vocab),
    )


def _random_tokens(rng: np.random.Generator, n: int, eos: int) -> np.ndarray:
    toks = rng.integers(0, 50, size=n).astype(np.int32)  # small vocab: EOS shows up often
    toks[rng.random(n) < 0.1] = eos
    return toks


@pytest.mark.parametrize("n_tokens", [1, 7, 512])
def test_hash_kernels_match_reference(rng: np.random.Generator, n_tokens: int) -> None:
    for _ in range(4):
        spec = _random_spec(rng, 2**31 - 1)
        hist = _random_tokens(rng, int(rng.integers(0, 12)), spec.eos_token_id)
        toks = _random_tokens(rng, n_tokens, spec.eos_token_id)
        ref = ple_rows(spec, toks, hist)
        dspec = DeviceHashSpec(spec)
        out = cupy.full(n_tokens * spec.n_heads, -7, dtype=cupy.int32)
        prev = prev_tokens(toks, spec.n_prev, hist)
        dspec.hash_prev(cupy.asarray(toks), cupy.asarray(prev), n_tokens, out)
        np.testing.assert_array_equal(out.get().reshape(ref.shape), ref)
        assert np.array_equal(ref, ple_rows_from_prev(spec, toks, prev))
        out.fill(-7)
        dspec.hash_seq(cupy.asarray(np.concatenate([hist, toks]).astype(np.int32)), hist.size, n_tokens, out)
        np.testing.assert_array_equal(out.get().reshape(ref.shape), ref)


def _write_table(path: Path, ggml_type: int, row_dim: int, data: np.ndarray) -> None:
    loc = write_single_tensor_gguf(path, PLE, ggml_type, (row_dim, data.shape[0]))
    with open(path, "r+b") as f:
        f.seek(loc.offset)
        f.write(np.ascontiguousarray(data).tobytes())


def _open(path: Path, mode: str, **kw: object) -> PleTable:
    try:
        return PleTable(locate_tensor(path, PLE), mode=mode, **kw)
    except PleTableError as exc:
        if mode == "pageable":
            pytest.skip(str(exc))
        raise


def _check_gather(table: PleTable, rows: np.ndarray, stream: object = None) -> None:
    ref = gather_dequant(table.host, table.ggml_type, table.row_dim, rows)
    for device_rows in (False, True):
        out = cupy.full(ref.shape, np.nan, dtype=cupy.float32)
        out.view(cupy.uint32).fill(0x7FBADBAD)  # a NaN pattern no decoder produces
        src = cupy.asarray(rows.astype(np.int32)) if device_rows else rows
        # `out`'s fill and the rows' copy ran on CuPy's current stream; a gather on another one
        # (a non-blocking stream, as llama.cpp's) is ordered after nothing there, so they must be
        # done first, as llama.cpp's inputs are done on its stream before it calls the provider
        cupy.cuda.get_current_stream().synchronize()
        table.gather(src, out, stream=stream)
        table.raise_on_bad_rows(stream)
        got = out.get()
        assert np.array_equal(_bits(got), _bits(ref)), (table.mode, device_rows)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ggml_type", SUPPORTED_TYPES)
@pytest.mark.parametrize("row_dim", [32, 160])
def test_gather_bit_exact(
    tmp_path: Path, rng: np.random.Generator, mode: str, ggml_type: int, row_dim: int
) -> None:
    n_rows = int(rng.integers(3000, 5000))
    path = tmp_path / "t.gguf"
    _write_table(path, ggml_type, row_dim, random_table(ggml_type, n_rows, row_dim, rng))
    # registered mode stages big host-row batches by default; stage_above_rows=None keeps them in place
    for extra in ({}, {"stage_above_rows": None}) if mode == "registered" else ({},):
        with _open(path, mode, max_register_fraction=0.9, **extra) as table:
            assert table.mode == mode
            for n_tokens in (1, 512):
                rows = rng.integers(0, n_rows, size=(n_tokens, N_HEADS)).astype(np.int32)
                rows[0, :3] = [0, n_rows - 1, 0]  # first, last, repeated
                rows[-1, -2:] = n_rows - 1
                _check_gather(table, rows)
            # a raw stream handle, as llama.cpp would pass its cudaStream_t
            s = cupy.cuda.Stream(non_blocking=True)
            _check_gather(table, rng.integers(0, n_rows, size=(3, N_HEADS)).astype(np.int32), s.ptr)


@pytest.mark.parametrize("mode", MODES)
def test_rows_out_of_range_are_refused(tmp_path: Path, rng: np.random.Generator, mode: str) -> None:
    path = tmp_path / "t.gguf"
    _write_table(path, GGML_TYPE_IQ4_NL, 64, random_table(GGML_TYPE_IQ4_NL, 100, 64, rng))
    with _open(path, mode, max_register_fraction=0.9) as table:
        out = cupy.zeros((1, 2 * 64), dtype=cupy.float32)
        for bad in (100, -1):
            with pytest.raises(IndexError):
                table.gather(np.array([[3, bad]], dtype=np.int32), out)
            if mode != "staged":  # staged pulls device rows to the host, where they are checked
                table.gather(cupy.asarray(np.array([[3, bad]], dtype=np.int32)), out)
                with pytest.raises(IndexError, match=f"row index {bad}"):
                    table.raise_on_bad_rows()
                assert np.isnan(out.get()[0, 64:]).all()
            else:
                with pytest.raises(IndexError):
                    table.gather(cupy.asarray(np.array([[3, bad]], dtype=np.int32)), out)
        _check_gather(table, np.array([[3, 99]], dtype=np.int32))  # still usable


def test_registration_is_refused_above_the_ram_share(tmp_path: Path, rng: np.random.Generator) -> None:
    path = tmp_path / "t.gguf"
    _write_table(path, GGML_TYPE_IQ4_NL, 64, random_table(GGML_TYPE_IQ4_NL, 1000, 64, rng))
    with pytest.raises(PleTableError, match="registered mode refused: pinning .* would exceed"):
        PleTable(locate_tensor(path, PLE), mode="registered", max_register_fraction=1e-12)
    with PleTable(locate_tensor(path, PLE), mode="auto", max_register_fraction=1e-12) as table:
        if table.access.pageable_memory_access:
            assert table.mode == "pageable"
        else:
            assert table.mode == "staged" and "registration refused" in table.mode_reason
        _check_gather(table, rng.integers(0, 1000, size=(5, N_HEADS)).astype(np.int32))


def test_auto_mode_reports_its_choice(tmp_path: Path, rng: np.random.Generator) -> None:
    path = tmp_path / "t.gguf"
    _write_table(path, GGML_TYPE_IQ4_NL, 64, random_table(GGML_TYPE_IQ4_NL, 1000, 64, rng))
    with PleTable(locate_tensor(path, PLE), max_register_fraction=0.9) as table:
        want = "pageable" if table.access.pageable_memory_access else "registered"
        assert table.mode == want
        d = table.describe()
        assert d["mode"] == want and d["mode_reason"] and d["n_rows"] == 1000


@pytest.fixture(scope="module")
def big_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("VELO_PLE_BIG_TABLE")
    if env and Path(env).exists():
        return Path(env)
    path = Path(env) if env else tmp_path_factory.mktemp("big") / "ple_big.gguf"
    write_single_tensor_gguf(path, PLE, GGML_TYPE_IQ4_NL, (160, BIG_ROWS))
    return path


@pytest.mark.parametrize(
    ("mode", "stage_above"),
    [("pageable", None), ("registered", None), ("registered", 1024), ("staged", None)],
)
def test_table_larger_than_8_gib(
    big_table: Path, rng: np.random.Generator, mode: str, stage_above: int | None
) -> None:
    rb = row_nbytes(GGML_TYPE_IQ4_NL, 160)
    loc = locate_tensor(big_table, PLE)
    assert loc.nbytes > 8 * 2**30 and loc.row_dim == 160
    n = loc.n_rows
    rows = rng.integers(0, n, size=(512, N_HEADS)).astype(np.int32)
    rows[0, :4] = [0, n - 1, n - 2, 0]
    rows[1, :] = n - 1
    fresh = random_table(GGML_TYPE_IQ4_NL, rows.size, 160, rng)
    with open(big_table, "r+b") as f:  # fresh random bytes in every row read (never zeros)
        for r, data in zip(rows.reshape(-1), fresh, strict=True):
            f.seek(loc.offset + int(r) * rb)
            f.write(data.tobytes())
    with _open(big_table, mode, max_register_fraction=0.9, stage_above_rows=stage_above) as table:
        assert table.mode == mode
        assert int(rows.max()) * rb > 2**32  # past 32-bit byte offsets
        _check_gather(table, rows)
        _check_gather(table, rows[:1])
