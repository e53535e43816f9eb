"""The verify batches a speculative context decodes at load (`LiveSequence.warm_up`), on a real
model: what a GPU load runs so that each batch size's kernels and CUDA graph exist before the
first turn. On the CPU it is not run at load (nothing there to capture), so these tests call it
directly; what it must guarantee is the same everywhere: it leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.spec_helpers import PROSE, run_turn, spec_engine
from velo_chat.engine.diagnostics import diagnostics


def test_warm_up_leaves_the_hybrid_model_as_new(qwen_path: Path, tmp_path: Path) -> None:
    """On the hybrid model, whose recurrent state and rollback snapshots a leftover would
    corrupt, the reply after a warm-up of every verify size is a fresh engine's, token for
    token, and the context holds the same tokens after it."""
    warmed = spec_engine(qwen_path, tmp_path / "w", spec=True)
    fresh = spec_engine(qwen_path, tmp_path / "f", spec=True)
    try:
        live = warmed._require()[2]
        live.warm_up(live.max_draft)
        assert len(live) == 0
        a, _, held_a = run_turn(warmed, PROSE, max_tokens=40)
        b, _, held_b = run_turn(fresh, PROSE, max_tokens=40)
        assert a == b and held_a == held_b
    finally:
        warmed.close()
        fresh.close()


def test_warm_up_needs_an_empty_context(smollm2_path: Path, tmp_path: Path) -> None:
    """Only before anything is in the context (it would be lost), and a `max_draft` beyond what
    the context's verify batches hold is cut to it rather than failing the load."""
    with spec_engine(smollm2_path, tmp_path, spec=True) as engine:
        live = engine._require()[2]
        assert live.warm_up(live.max_draft + 5) > 0
        assert len(live) == 0
        # every verify size it built counts as verified: a turn times its first batch of each
        # (on a GPU the load's own warm-up made some of them already)
        assert live.verified_sizes == set(range(2, live.max_draft + 2))
        live.extend(diagnostics(engine).tokens_for(PROSE)[:8])
        with pytest.raises(RuntimeError, match="empty context"):
            live.warm_up(2)
        assert len(live) == 8
