"""`Engine.speculation_if_enabled`: the guarantee line `bench --spec` prints above its "on"
column, what a profile that enables speculation gets on a setup (real SmolLM2 and the tiny
hybrid qwen4exp)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.spec_helpers import on_gpu as _on_gpu
from tests.support.spec_helpers import spec_engine as _engine


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
            assert e.speculation == "off"
            if _on_gpu(e):
                pytest.skip("the CPU's guarantee; every layer is on the GPU here")
            assert e.speculation_if_enabled.startswith(expected)
            assert threads == 1 or "decode on 2 threads" in e.speculation_if_enabled
        with _engine(
            smollm2_path, tmp_path / f"{threads}on", spec=True, context=context, speculation=strict
        ) as e:
            assert e.speculation == e.speculation_if_enabled


def test_speculation_if_enabled_on_a_hybrid_model_needs_a_reload(qwen_path: Path, tmp_path: Path) -> None:
    """A hybrid model's context made without speculation keeps no recurrent-state snapshots:
    enabling speculation there takes a reload, and `speculation_if_enabled` says so."""
    with _engine(qwen_path, tmp_path / "a", spec=False) as e:
        assert e.speculation == "off"
        assert e.speculation_if_enabled.startswith("off: this hybrid model's context was made without")
    with _engine(qwen_path, tmp_path / "b", spec=True) as e:
        assert e.speculation.startswith("on:") and e.speculation == e.speculation_if_enabled
