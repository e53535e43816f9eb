"""`Diagnostics.speculation_if_enabled`: the guarantee line `bench --spec` prints above its "on"
column, what a profile that enables speculation gets on a setup (real SmolLM2 and the tiny
hybrid qwen4exp)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.spec_helpers import PROSE
from tests.support.spec_helpers import on_gpu as _on_gpu
from tests.support.spec_helpers import spec_engine as _engine
from velo_chat.engine.diagnostics import diagnostics


def test_speculation_if_enabled_says_what_a_profile_that_enables_it_gets(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """A profile that leaves speculation off reads "off"; `speculation_if_enabled` (what
    `bench --spec` prints above its "on" column) says what enabling it would give on the same
    setup, and why not where it would not draft."""
    strict = {"allow_batch_rounding": False}
    for threads, expected in ((1, "on: bit-identical"), (2, "off: a verify batch would round")):
        context = {"n_threads": threads, "flash_attn": "on"}
        with _engine(
            smollm2_path, tmp_path / str(threads), spec=False, context=context, speculation=strict
        ) as e:
            assert diagnostics(e).speculation == "off"
            if _on_gpu(e):
                pytest.skip("the CPU's guarantee; every layer is on the GPU here")
            assert diagnostics(e).speculation_if_enabled.startswith(expected)
            assert threads == 1 or "decode on 2 threads" in diagnostics(e).speculation_if_enabled
        with _engine(
            smollm2_path, tmp_path / f"{threads}on", spec=True, context=context, speculation=strict
        ) as e:
            assert diagnostics(e).speculation == diagnostics(e).speculation_if_enabled


def test_speculation_if_enabled_on_a_hybrid_model_needs_a_reload(qwen_path: Path, tmp_path: Path) -> None:
    """A hybrid model's context made without speculation keeps no recurrent-state snapshots:
    enabling speculation there takes a reload, and `speculation_if_enabled` says so."""
    with _engine(qwen_path, tmp_path / "a", spec=False) as e:
        assert diagnostics(e).speculation == "off"
        assert diagnostics(e).speculation_if_enabled.startswith(
            "off: this hybrid model's context was made without"
        )
    with _engine(qwen_path, tmp_path / "b", spec=True) as e:
        assert (
            diagnostics(e).speculation.startswith("on:")
            and diagnostics(e).speculation == diagnostics(e).speculation_if_enabled
        )


@pytest.fixture(scope="module")
def smollm2_q4_k_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 requantized to Q4_K_M (Q4_K and Q6_K matrices) by llama.cpp's quantizer: the
    weight types of most GGUFs people download."""
    from llama_cpp import llama_cpp as ll

    target = tmp_path_factory.mktemp("q4_k") / "smol-Q4_K_M.gguf"
    params = ll.llama_model_quantize_default_params()
    params.ftype = ll.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.allow_requantize = True
    assert ll.llama_model_quantize(str(smollm2_path).encode(), str(target).encode(), params) == 0
    return target


def test_k_quant_weights_are_not_promised_bit_identical(
    smollm2_q4_k_path: Path, smollm2_q8_path: Path, tmp_path: Path
) -> None:
    """Why the guarantee depends on the weight types: on the CPU a batch of K-quant weights
    takes the repacked GEMM kernels and a single token the one-row dot product, and their logits
    differ, enough here to change an argmax. So a Q4_K_M model reads "batch rounding" and names
    its types, and the same model as Q8_0 (one set of sums for both) reads bit-identical."""
    strict = {"allow_batch_rounding": False}
    with _engine(smollm2_q4_k_path, tmp_path / "k", spec=True, speculation=strict) as e:
        if _on_gpu(e):
            pytest.skip("the CPU's guarantee; every layer is on the GPU here")
        assert diagnostics(e).speculation.startswith("off: a verify batch would round")
        assert (
            "Q4_K, Q6_K weights" in diagnostics(e).speculation
            and "velo-chat requantize" in diagnostics(e).speculation
        )
        d = diagnostics(e).verify_logit_differences(PROSE, 12, (1, 2, 4, 8, 16))
        assert max(d["max_abs_diff"].values()) > 0.1  # the measured reason for the rule
    with _engine(smollm2_q8_path, tmp_path / "q8", spec=True, speculation=strict) as e:
        assert diagnostics(e).speculation == "on: bit-identical to plain decoding"


def test_batch_weight_types(smollm2_path: Path) -> None:
    """SmolLM2 ties its output to the token embeddings (Q8_0), so they are multiplied too; a
    model with an output matrix of its own only reads rows from them (and 1-D norms never count)."""
    from velo_chat.engine.llama.gguf_file import GGUFHeader, TensorInfo, read_header
    from velo_chat.engine.speculation.stepper import batch_weight_types

    assert batch_weight_types([read_header(smollm2_path)]) == {3, 8}  # Q4_1 layers, Q8_0 output

    def header(*tensors: tuple[str, tuple[int, ...], int]) -> GGUFHeader:
        infos = tuple(TensorInfo(n, shape, t, 0) for n, shape, t in tensors)
        return GGUFHeader(Path("m.gguf"), 3, {}, infos, 0, 0, "")

    embd, norm, layer = (
        ("token_embd.weight", (64, 1000), 14),
        ("blk.0.norm", (64,), 0),
        ("blk.0.ffn", (64, 64), 8),
    )
    assert batch_weight_types([header(embd, norm, layer)]) == {14, 8}  # tied: Q6_K embeddings multiplied
    assert batch_weight_types([header(embd, norm, layer, ("output.weight", (64, 1000), 8))]) == {8}
    # the output matrix in another shard than the embeddings still unties them
    assert batch_weight_types([header(embd, norm), header(layer, ("output.weight", (64, 1000), 8))]) == {8}


def test_batch_weight_types_read_every_shard(smollm2_path: Path, tmp_path: Path) -> None:
    """A split model's first shard may hold only the token embeddings: the layers' Q4_1 weights
    are in the other shards, and the engine's guarantee must see them."""
    from devkit.gguf_split import split_gguf
    from velo_chat.engine.llama.gguf_file import read_header, shard_headers
    from velo_chat.engine.speculation.stepper import batch_weight_types

    shards = split_gguf(smollm2_path, tmp_path / "smol.gguf", max_tensors=1)
    first = read_header(shards[0])
    assert [t.name for t in first.tensors] == ["token_embd.weight"]
    assert batch_weight_types([first]) == {8}  # the first shard alone would miss the layers
    headers = shard_headers(first)
    assert len(headers) == len(shards) > 2
    assert batch_weight_types(headers) == batch_weight_types([read_header(smollm2_path)]) == {3, 8}
    shards[-1].unlink()
    with pytest.raises(Exception, match="missing"):
        shard_headers(first)
