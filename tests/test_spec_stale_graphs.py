"""A decode call whose graph is stale (its KV window moved since the last call of its size) and
what speculation's cost model makes of it.

llama.cpp pads the attention's KV length to 256 cells, so a graph keeps its shapes until the
context's end crosses into the next window. `LiveSequence.graph_stale` says when a call will
find its graph changed; the real SmolLM2 checks that against llama.cpp's own graph reuse. The
cost model then times what such a call costs more (`CostModel.stale`) from the one-token steps
that cross a window, keeps those steps out of the one-token time, and prices a stale verify
batch with it (measured on an H200: a stale verify of 2 tokens 4.2-4.5 one-token steps in novel
text against 1.7 when only its graph was built anew)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.spec_helpers import PROSE, spec_engine
from velo_chat.engine.speculation import cost as spec_cost
from velo_chat.engine.live_sequence import KV_WINDOW
from velo_chat.engine.speculation.cost import CostModel
from velo_chat.engine.diagnostics import diagnostics


def test_graph_stale_is_when_llama_cpp_cannot_reuse_its_graph(smollm2_path: Path, tmp_path: Path) -> None:
    """One-token steps and verify batches of one size, back to back across the 256-cell
    boundary: llama.cpp reuses the previous call's graph exactly when `graph_stale` says the
    call's window is the one its size last ran in."""
    engine = spec_engine(smollm2_path, tmp_path, spec=True, context={"n_ctx": 1024})
    try:
        _model, _ctx, live = engine._require()
        prompt = diagnostics(engine).tokens_for(PROSE, diagnostics(engine).template_variables())
        filler = (prompt * (KV_WINDOW // len(prompt) + 2))[: KV_WINDOW - 12]
        live.extend(filler)
        seen = []
        for i in range(24):  # the context's end goes from 245 to 268 tokens
            stale = live.graph_stale(1)
            before = live.perf().n_reused
            live.append(filler[i])
            if i:  # the first follows the prefill's graph: never reused
                seen.append((len(live), stale, live.perf().n_reused > before))
        assert all(stale != reused for _n, stale, reused in seen), seen
        assert [n for n, stale, _ in seen if stale] == [KV_WINDOW + 1]
        # verify batches of 5 tokens, all kept, across the next boundary (512)
        live.extend(filler[: 2 * KV_WINDOW - 14 - len(live)])
        seen = []
        for i in range(6):
            stale = live.graph_stale(5)
            before = live.perf().n_reused
            live.verify(filler[5 * i : 5 * i + 5])
            if i:
                seen.append((len(live), stale, live.perf().n_reused > before))
        assert all(stale != reused for _n, stale, reused in seen), seen
        assert [n for n, stale, _ in seen if stale] == [2 * KV_WINDOW + 1]
        # a rollback inside the window keeps the graph: the next batch of 5 reuses it
        live.rollback(2)
        assert not live.graph_stale(5)
    finally:
        engine.close()


ONE_MS = 0.001


def _steady(cost: CostModel, steps: int = 3) -> None:
    for _ in range(steps):
        cost.record(1, ONE_MS)


def test_cost_model_times_stale_steps_apart() -> None:
    """A one-token step that crosses a window (4.1 steps on an H200 for SmolLM2) teaches
    `stale` and leaves the one-token time alone; a stale batch's own cost is what is left of its
    time after `stale`."""
    cost = CostModel(slope=0.8)
    _steady(cost)
    cost.record(1, 4.1 * ONE_MS, stale=True)
    assert cost.step_seconds == pytest.approx(ONE_MS)  # not lifted by the stale step
    assert cost.stale == pytest.approx(3.1)
    cost.record(1, 6.1 * ONE_MS, stale=True)  # a moving average, like the other costs
    assert cost.stale == pytest.approx(3.1 + cost.alpha * 2.0)
    cost.record(1, 100 * ONE_MS, stale=True)  # descheduled: capped
    assert cost.stale <= 3.5 + cost.alpha * spec_cost.MAX_STALE_SAMPLE
    fresh = CostModel(slope=0.8, stale=3.1)  # what an earlier turn of the context timed
    _steady(fresh)
    fresh.record(17, 3.3 * ONE_MS)
    fresh.record(17, 3.3 * ONE_MS)
    fresh.record(17, (3.3 + 3.1) * ONE_MS, stale=True)
    assert fresh.relative(17) == pytest.approx(3.3)


def test_a_stale_draft_is_priced_and_declined_where_it_does_not_pay() -> None:
    """SmolLM2 on an H200: a one-token step 1 unit, a verify of 8 tokens 1.48, the plain step
    after a verify 1.6 (a new graph, `rebuild` 0.6), a stale graph 3.1 more. A draft of 7
    accepted at 0.7 pays when its batch's graph is current and not when it is stale; a copy
    (0.97) pays either way."""
    cost = CostModel(slope=0.8, stale=3.1)
    _steady(cost)
    for n, units in ((8, 1.48), (8, 1.48), (1, 1.6), (1, 1.0), (1, 1.0)):
        cost.record(n, units * ONE_MS)
    assert cost.rebuild == pytest.approx(0.6)
    assert cost.call_cost(8, 1, stale=True) == pytest.approx(1.48 + 3.1 + 0.6)
    assert cost.call_cost(8, 1) == pytest.approx(1.48 + 2 * 0.6)
    assert cost.call_cost(8, 8, stale=True) == pytest.approx(1.48 + 3.1)

    def best(a: float, stale: bool) -> int:
        return spec_cost.best_draft_length(a, 7, cost, 1.05, prev=1, stale=lambda n: stale)

    assert best(0.7, stale=False) == 7
    assert best(0.7, stale=True) == 0
    assert best(0.97, stale=True) == 7
    # not timed yet: a stale graph costs at least a new one
    unknown = CostModel(slope=0.8)
    _steady(unknown)
    for n, units in ((8, 1.48), (8, 1.48), (1, 1.6), (1, 1.0)):
        unknown.record(n, units * ONE_MS)
    assert unknown.call_cost(8, 1, stale=True) == pytest.approx(unknown.call_cost(8, 1))
