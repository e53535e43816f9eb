"""Speculation stops drafting in a turn whose verify batches lose time against plain decoding,
and starts again once a run of drafts would have been right (`SpecStepper`'s guard).

Real SmolLM2, real verify batches and rollbacks; only the stepper's clock is virtual (a
one-token step takes one unit, a verify batch `VERIFY` units), so what the guard sees does not
depend on this machine's speed or load, and the cost model is set aside (every batch priced as
one step) so that the guard alone decides. The draft source is given the plain reply first
(an oracle), so every draft would be accepted: the guard must stop drafts that are right but
too dear, and the reply must stay the plain one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.spec_helpers import (
    PROSE,
    Clocked,
    oracle_session,
    run_turn,
    same_reply,
    spec_engine,
    tolerance,
)
from velo_chat.engine.speculation import stepper as speculation
from velo_chat.engine import turn_runner
from velo_chat.engine.speculation.cost import CostModel
from velo_chat.engine.speculation.stepper import SpecStepper


def _stepper(
    monkeypatch: pytest.MonkeyPatch, oracle: list[int], verify: float, first: float | None = None
) -> None:
    class Timed(SpecStepper):
        def __init__(self, live, sampler, settings, session):
            super().__init__(live, sampler, settings, [*oracle, *session])
            self.live = clocked = Clocked(live, verify, first)
            self.clock = lambda: clocked.now
            if first is not None:
                return  # the cost model as shipped, timed by the virtual clock
            cost = self.cost = CostModel(slope=0.0)
            cost.record(1, 1.0)  # a one-token step is one unit ...
            cost.record = lambda n, seconds, stale=False: setattr(cost, "last", n)  # type: ignore[method-assign]
            # ... and every batch is priced as one step: only the guard stops drafts

    monkeypatch.setattr(turn_runner, "SpecStepper", Timed)


@pytest.mark.parametrize("verify", [30.0, 1.0])
def test_guard_stops_drafts_that_lose_time(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify: float
) -> None:
    plain = spec_engine(smollm2_path, tmp_path / "a", spec=False)
    spec = spec_engine(smollm2_path, tmp_path / "b", spec=True)
    try:
        a = run_turn(plain, PROSE, max_tokens=100, ignore_eos=True)  # the oracle runs past the turn
        tol = tolerance(spec, PROSE)
        _stepper(monkeypatch, oracle_session(spec, PROSE, a[0]), verify)
        b = run_turn(spec, PROSE, max_tokens=80, ignore_eos=True)
        st = b[1].stats
        if not same_reply(plain, PROSE, a[0][:80], b[0], tol):
            return  # on a GPU: diverged at a near-tie (asserted); the oracle is wrong after it
        assert (
            st.speculation.rounds > 0 and st.speculation.acceptance > 0.6
        )  # the oracle is right (the reply's
        # own repeats, found later than the oracle's, are not always)
        if verify == 1.0:  # verify batches pay: drafting never stops
            assert st.speculation.guarded == 0 and st.speculation.declined == 0
            assert st.tokens_per_call > 4
        else:  # each batch of at most 9 tokens loses over 20 steps: stopped after every one but
            # the first of each size (not timed: it builds what the backend keeps for the
            # shape), restarted after a run of right drafts not taken, longer after each stop (a
            # batch restarted with a wrong draft leaves the stop as it is)
            assert 3 <= st.speculation.guarded <= st.speculation.rounds - len(st.speculation.batches)
            need = sum(
                min(speculation.GUARD_STREAK * 2**i, speculation.MAX_GUARD_STREAK)
                for i in range(st.speculation.guarded - 1)
            )
            assert st.speculation.declined >= need
            assert st.tokens_per_call < 2
            # the turn reports each timed size at the clock's 30 steps (the one-token step,
            # priced at one unit before the cost model was set aside, is the yardstick)
            assert st.speculation.batch_steps and all(
                v == pytest.approx(30.0) for v in st.speculation.batch_steps.values()
            )
            assert st.speculation.after_verify_steps == pytest.approx(1.0)  # stopped: plain steps follow
    finally:
        plain.close()
        spec.close()


def test_first_batch_of_a_size_is_not_timed(smollm2_path: Path, tmp_path: Path, monkeypatch) -> None:
    """The context's first batch of a size builds what the backend keeps for that shape (on a
    GPU a CUDA graph is captured): here it takes 200 steps and every later one a single step.
    The cost model does not time it, and the guard books it at no more than the price it was
    drafted at: the turn drafts on, as from the second batch of each size. (Timed, that first
    batch tripped the guard at once, and a `max_draft` of 4 on an H200 declined every draft of
    a copy after one slow first batch.)"""
    plain = spec_engine(smollm2_path, tmp_path / "a", spec=False)
    spec = spec_engine(smollm2_path, tmp_path / "b", spec=True)
    try:
        a = run_turn(plain, PROSE, max_tokens=100, ignore_eos=True)
        _stepper(monkeypatch, oracle_session(spec, PROSE, a[0]), 1.0, first=200.0)
        b = run_turn(spec, PROSE, max_tokens=80, ignore_eos=True)
        st = b[1].stats
        if not same_reply(plain, PROSE, a[0][:80], b[0], tolerance(spec, PROSE)):
            return  # on a GPU: diverged at a near-tie (asserted)
        assert st.speculation.guarded == 0
        # (2.9 tokens a call: 80 tokens leave little room to learn each match bucket's
        # continuation from verify batches, which the longest drafts wait for)
        assert st.speculation.rounds >= 5 and st.tokens_per_call > 2.5
        # what the turn reports its batches cost, on the virtual clock: a step each, the first
        # of each size (200 steps) left out
        assert st.speculation.batch_steps and set(st.speculation.batch_steps) <= set(st.speculation.batches)
        assert all(v == pytest.approx(1.0) for v in st.speculation.batch_steps.values())
        timed = sum(st.speculation.batches.values()) - len(st.speculation.batches)
        assert timed > 0
        # (0.0 where every verify of the turn followed another: no plain step after one)
        assert st.speculation.after_verify_steps in (0.0, pytest.approx(1.0))
        assert b[1].stats.to_json()["speculation"]["batch_steps"] == {
            str(n): 1.0 for n in st.speculation.batch_steps
        }
    finally:
        plain.close()
        spec.close()
