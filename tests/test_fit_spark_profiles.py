"""The shipped DGX Spark profiles against one another: their fit tables differ exactly where the
profiles' own comments say (context-sized terms and the checkpoint budget), and nowhere else.

The real model's headers are not here (103.7 GiB), and the estimate only needs its facts, so the
facts are a stand-in with Qwen3.8-Flash-Next's layout (48 layers, attention in every fourth,
GQA, a 26.8 GiB PLE table, 77 GiB of other weights in four shards). What is checked is how the
three tables relate, which does not depend on the exact sizes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from velo_chat.engine.config.profiles import shipped_profile
from velo_chat.engine.fit.estimate import estimate
from velo_chat.engine.fit.model_facts import ModelFacts, Shard

GIB = 2**30
N_LAYER = 48


def _qwen38_like() -> ModelFacts:
    kv = tuple(range(3, N_LAYER, 4))
    rec = tuple(i for i in range(N_LAYER) if i not in kv)
    layer = int(77 * GIB / N_LAYER)
    return ModelFacts(
        path=Path("/models/qwen38-00001-of-00004.gguf"),
        architecture="qwen4exp",
        shards=tuple(
            Shard(Path(f"/models/qwen38-0000{i}-of-00004.gguf"), int(25.9 * GIB)) for i in range(1, 5)
        ),
        n_layer=N_LAYER,
        n_embd=2560,
        n_vocab=151_936,
        n_head=32,
        n_ctx_train=262_144,
        layer_bytes=(layer,) * N_LAYER,
        input_bytes=0,
        output_bytes=int(0.4 * GIB),
        tied_output=False,
        token_embd_bytes=int(0.4 * GIB),
        ple_bytes=int(26.8 * GIB),
        ple_offset=0,
        ple_shard=Path("/models/qwen38-00004-of-00004.gguf"),
        kv_layers=kv,
        kv_k_width=(4 * 256,) * len(kv),
        kv_v_width=(4 * 256,) * len(kv),
        recurrent_layers=rec,
        n_embd_r=3 * 8192,
        n_embd_s=32 * 128 * 128,
        ple_conv_state=3 * 5120,
        indexer_key_length=128,
        indexer_heads=16,
        attention_pattern_note="every 4th layer (full_attention_interval 4)",
        n_pos_per_token=4,
        indexer_ratio=4,
        ple_heads=16,
        ple_head_dim=160,
        hc=2,
        head_dim_k=256,
        head_dim_v=256,
        ssm_conv=4,
        ssm_channels=8192,
    )


def _table(name: str) -> dict[str, int]:
    profile = shipped_profile(name)
    assert profile is not None, name
    terms = estimate(profile, _qwen38_like(), gpu_offload=True, integrated_gpu=True)
    return {t.key: t.bytes for t in terms}


@pytest.fixture(scope="module")
def tables() -> dict[str, dict[str, int]]:
    return {n: _table(n) for n in ("spark-qwen38-lowmem", "spark-qwen38", "spark-qwen38-long")}


def test_the_context_sized_terms_grow_with_n_ctx_and_nothing_else_moves(tables) -> None:
    low, mid, long = tables["spark-qwen38-lowmem"], tables["spark-qwen38"], tables["spark-qwen38-long"]
    assert low.keys() == mid.keys() == long.keys()
    kv = [k for k in mid if k.startswith("kv")]
    assert kv, sorted(mid)
    for k in kv:  # 64K, 128K, 256K: the KV cache doubles each time
        assert mid[k] == 2 * low[k] and long[k] == 2 * mid[k], k
    moved = {k for k in mid if not (low[k] == mid[k] == long[k])}
    context_sized = set(kv) | {k for k in mid if k.startswith(("compute", "checkpoints"))}
    assert moved == context_sized, (moved, context_sized)
    for k in moved:
        assert low[k] < mid[k] < long[k], k
    assert {"weights_gpu", "ple", "rs_gpu"} <= mid.keys() - moved  # weights, table, recurrent state


def test_each_step_up_costs_gibibytes_the_page_cache_no_longer_has(tables) -> None:
    """What the comments promise a user: the long profile costs memory the PLE table's page
    cache then lacks, the low-memory one frees some."""
    total = {n: sum(t.values()) for n, t in tables.items()}
    assert total["spark-qwen38-long"] - total["spark-qwen38"] > 2 * GIB
    assert total["spark-qwen38"] - total["spark-qwen38-lowmem"] > 1 * GIB


def test_snapshots_count_only_where_the_engine_keeps_them() -> None:
    """A hybrid model drafts, and keeps a recurrent-state snapshot per draft token, only when the
    profile accepts the batch rounding: the recurrent row grows by (1 + max_draft) then alone."""
    import dataclasses

    base = shipped_profile("spark-qwen38")
    assert base is not None

    def rs(**spec: object) -> int:
        p = dataclasses.replace(base, speculation=dataclasses.replace(base.speculation, **spec))
        terms = estimate(p, _qwen38_like(), gpu_offload=True, integrated_gpu=True)
        return next(t.bytes for t in terms if t.key == "rs_gpu")

    off = rs(enabled=False)
    assert rs(enabled=True, allow_batch_rounding=False) == off
    drafted = rs(enabled=True, allow_batch_rounding=True, max_draft=16)
    assert drafted > off and drafted == pytest.approx(off * 17, rel=0.01)


SPARK_PROFILES = ("spark-qwen38-lowmem", "spark-qwen38", "spark-qwen38-long")
PROFILES_DIR = Path(__file__).resolve().parents[1] / "assets" / "profiles"


@pytest.mark.parametrize("name", SPARK_PROFILES)
def test_spark_profiles_speculate_with_what_a_gpu_needs_and_say_what_it_trades(name) -> None:
    """Speculation on, with the batch rounding a GPU and a hybrid model need (without it the
    engine would not speculate at all there), a GPU-sized cost prior, snapshots the fit check
    counts; the profile's comment says what that trades and how to turn it off."""
    profile = shipped_profile(name)
    assert profile is not None
    spec = profile.speculation
    assert spec.enabled and spec.allow_batch_rounding
    assert spec.max_draft + 1 <= profile.context.n_ubatch
    assert 0.0 < spec.batch_cost_prior < 0.8  # below the default, which fits a CPU's batch
    text = (PROFILES_DIR / f"{name}.toml").read_text()
    comment = text[text.index("[speculation]") : text.index("enabled = true")]
    assert "rounding" in comment and "enabled = false" in comment
    with_spec = estimate(profile, _qwen38_like(), gpu_offload=True, integrated_gpu=True)
    assert next(t.bytes for t in with_spec if t.key == "rs_gpu") > 0
