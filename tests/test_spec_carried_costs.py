"""The context keeps its speculation cost model across turns (`CostModel.begin_turn`) where
`speculation.keep_costs` says so ("auto": with layers on a GPU), carried but not trusted: a
turn's first timing replaces a carried cost, a carried size is priced no dearer than the prior,
and a run of right drafts that the carried costs decline is verified anyway
(`speculation.EXPLORE_STREAK`), so a cost timed high once does not price drafts out for the
context's life.

The unit tests price with SmolLM2's costs on an H200 (a one-token step 1 unit, a verify of 17
tokens 3.2, a new graph 0.9); the stepper test runs real SmolLM2 turns with the stepper's clock
virtual, as in `test_spec_guard.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.spec_helpers import (
    PROSE,
    Clocked,
    on_gpu as spec_on_gpu,
    oracle_session,
    run_turn,
    same_reply,
    spec_engine,
    tolerance,
)
from velo_chat.engine.speculation import cost as spec_cost, stepper as speculation
from velo_chat.engine import turn_runner
from velo_chat.engine.speculation.cost import CostModel, best_draft_length
from velo_chat.engine.speculation.stepper import SpecStepper
from velo_chat.engine.diagnostics import diagnostics

UNIT = 0.001  # a one-token step's seconds


def _timed(cost: CostModel, calls: list[tuple[int, float]]) -> None:
    """Record each (size, units) call, after three steady one-token steps."""
    for n, units in [(1, 1.0)] * 3 + calls:
        cost.record(n, units * UNIT)


def _h200_turn() -> CostModel:
    """A turn that timed verify runs of 17 tokens (3.2 steps, 0.9 more for the new graph into
    the first batch of a run) and the plain step after each (1.9: its new graph 0.9)."""
    cost = CostModel(slope=0.8)
    _timed(cost, [(17, 4.1), (17, 3.2), (1, 1.9), (1, 1.0), (17, 4.1), (1, 1.9), (1, 1.0)])
    return cost


def test_a_turn_starts_from_the_costs_the_context_timed() -> None:
    cost = _h200_turn()
    assert cost.rebuild == pytest.approx(0.9) and cost.relative(17) == pytest.approx(3.2)
    cost.begin_turn(0.8)
    assert cost.carried and cost.last == 0 and cost.step_seconds is None
    _timed(cost, [])  # the new turn times its one-token step again
    # the turn's first draft pays for the new graphs, into the batch and back
    assert cost.call_cost(17, 1) == pytest.approx(3.2 + 2 * 0.9)
    fresh = CostModel(slope=0.8)
    _timed(fresh, [])
    assert fresh.call_cost(2, 1) == pytest.approx(1.8)  # the prior alone, no new graph
    # a 32-token match (the prior's acceptance 0.9): the prior alone drafts one token, which on
    # this GPU costs about 1.1 + 2 x 0.9 steps for at most 2 tokens; the carried costs draft
    # a long run, whose new graphs its tokens pay for
    assert best_draft_length(0.9, 16, fresh, 1.05, prev=1) == 1
    assert best_draft_length(0.9, 16, cost, 1.05, prev=1) >= 8
    # and a draft that no length makes pay once the new graphs are priced is declined
    assert best_draft_length(0.6, 16, cost, 1.05, prev=1) == 0


def test_a_carried_cost_is_replaced_by_the_turns_first_timing() -> None:
    """A turn on a busy machine timed 17 tokens at the cap and a new graph at the cap; the next
    turn's first timings replace both (a moving average would still say 27 and 4.2)."""
    cost = CostModel(slope=0.8)
    _timed(cost, [(17, 60.0), (17, 60.0), (1, 30.0), (1, 1.0)])
    assert cost.relative(17) == pytest.approx(1 + spec_cost.MAX_SLOPE_SAMPLE * 16)
    assert cost.rebuild == pytest.approx(spec_cost.MAX_REBUILD_SAMPLE)
    cost.begin_turn(0.8)
    # carried, a size is priced no dearer than the prior (a size timed in a long turn costs
    # more there than in a short one), and the new graph as timed until the turn times it
    assert cost.relative(17) == pytest.approx(1 + 0.8 * 16)
    assert cost.rebuild == pytest.approx(spec_cost.MAX_REBUILD_SAMPLE) and cost.carried
    _timed(cost, [(17, 3.2 + 0.9), (1, 1.9)])  # after a plain step: its new graph included
    assert not cost.carried
    assert cost.rebuild == pytest.approx(0.9)
    assert cost.relative(17) == pytest.approx(3.2)
    _timed(cost, [(17, 4.1), (17, 3.2), (1, 1.9), (1, 1.0)])  # and the turn goes on from them
    assert cost.relative(17) == pytest.approx(3.2) and cost.rebuild == pytest.approx(0.9)


def test_begin_turn_takes_the_profiles_prior() -> None:
    """`batch_cost_prior` is a setting that takes effect without a reload: the next turn prices
    the sizes not timed yet with it."""
    cost = CostModel(slope=0.8)
    cost.begin_turn(0.1)
    assert cost.relative(9) == pytest.approx(1.8)
    _timed(cost, [(5, 1.4), (1, 1.0), (5, 1.4)])
    cost.begin_turn(0.5)
    assert cost.relative(5) == pytest.approx(1.4)


def _carried_too_high(monkeypatch: pytest.MonkeyPatch, oracle: list[int], explore: int) -> list[CostModel]:
    """The stepper on a virtual clock (a step one unit, a verify batch one unit), in a context
    whose earlier turn timed a new graph at the cap (5 steps: a descheduled step) and every
    verify size at the cap too. Returns the list that receives the carried cost model."""
    monkeypatch.setattr(speculation, "EXPLORE_STREAK", explore)
    kept: list[CostModel] = []

    class Timed(SpecStepper):
        def __init__(self, live, sampler, settings, session):
            high = CostModel(slope=settings.batch_cost_prior)
            for n in range(2, settings.max_draft + 2):  # a whole turn's worth, each twice
                high_n = 1 + 2 * (n - 1)  # the cap; after a plain step, the new graph too
                _timed(high, [(n, high_n + 5), (n, high_n), (1, 6.0), (1, 1.0)])
            assert high.rebuild == pytest.approx(spec_cost.MAX_REBUILD_SAMPLE)
            live.spec_costs = high
            kept.append(high)
            super().__init__(live, sampler, settings, [*oracle, *session])
            self.live = clocked = Clocked(live, 1.0)
            self.clock = lambda: clocked.now

    monkeypatch.setattr(turn_runner, "SpecStepper", Timed)
    return kept


def test_a_copy_is_drafted_again_after_costs_timed_too_high(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every draft of the turn would be right (the plain reply is in the draft source) and a
    verify batch, or a plain step after one, costs one step; but the carried costs say a new
    graph costs 5 steps, and each verify leaving plain steps builds two: they decline every
    draft. After `EXPLORE_STREAK` right drafts declined in a row the stepper verifies one
    anyway; the plain step after it times the new graph again, and the turn drafts on. Without
    that the turn never verifies at all (and nothing would ever time the new graph again)."""
    plain = spec_engine(smollm2_path, tmp_path / "a", spec=False)
    spec = spec_engine(smollm2_path, tmp_path / "b", spec=True, speculation={"keep_costs": "on"})
    try:
        a = run_turn(plain, PROSE, max_tokens=100, ignore_eos=True)
        oracle = oracle_session(spec, PROSE, a[0])
        kept = _carried_too_high(monkeypatch, oracle, explore=1 << 20)  # never explore
        never = run_turn(spec, PROSE, max_tokens=100, ignore_eos=True)[1].stats
        assert never.speculation.rounds == 0 and never.speculation.declined > 60
        assert kept[-1].rebuild == pytest.approx(spec_cost.MAX_REBUILD_SAMPLE) and kept[-1].carried
        diagnostics(spec).reset()
        kept = _carried_too_high(monkeypatch, oracle, explore=12)
        b = run_turn(spec, PROSE, max_tokens=100, ignore_eos=True)
        st = b[1].stats
        if not same_reply(plain, PROSE, a[0], b[0], tolerance(spec, PROSE)):
            return  # on a GPU: diverged at a near-tie (asserted); the oracle is wrong after it
        assert st.speculation.declined >= 12  # declined until the run of 12, then tried
        assert kept[-1].rebuild < 0.5  # timed again: a plain step after a verify costs a step
        assert st.speculation.rounds >= 10 and st.speculation.declined < 40
    finally:
        plain.close()
        spec.close()


@pytest.mark.parametrize("keep", ["on", "off", "auto"])
def test_keep_costs_decides_what_the_next_turn_starts_from(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: str
) -> None:
    """Two turns in one context: with `keep_costs` on, the second turn prices with the model
    the first one timed (a batch size it timed is priced at once); off, it starts from the
    prior again, keeping only what a stale graph costs; auto follows where the layers run."""
    models: list[CostModel] = []

    class Seen(SpecStepper):
        def __init__(self, live, sampler, settings, session):
            super().__init__(live, sampler, settings, session)
            models.append(self.cost)

    monkeypatch.setattr(turn_runner, "SpecStepper", Seen)
    spec = spec_engine(smollm2_path, tmp_path, spec=True, speculation={"keep_costs": keep})
    try:
        run_turn(spec, PROSE, max_tokens=64, ignore_eos=True)
        first = models[-1]
        timed = dict(first.measured)
        stale = first.stale
        run_turn(spec, PROSE, max_tokens=8, ignore_eos=True)
        second = models[-1]
        kept = keep == "on" or (keep == "auto" and spec_on_gpu(spec))
        assert (second is first) == kept
        if kept:  # each size the first turn timed is priced at once
            assert set(timed) <= set(second.measured)
        else:  # a new model, with what a stale graph costs (the plain steps time it every 256
            # tokens, this short turn none)
            assert not second.carried and second.stale == stale
    finally:
        spec.close()
