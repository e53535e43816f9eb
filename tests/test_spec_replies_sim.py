"""The shipped stepper over a recorded reply, on a virtual clock charged from a cost table
(`devkit/spec_sim.py`, which `benchmarks/spec_replies_sim.py` runs). Its bookkeeping is checked
on token streams whose answer is known (the recording itself is `Engine.turn`, tested
elsewhere); the script itself runs as a command on saved replies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from devkit import spec_sim as sim
from velo_chat.engine.config.profile_schema import SpeculationSettings

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "spec_replies_sim.py"

SETTINGS = SpeculationSettings(enabled=True)
PROMPT = list(range(100, 160))


def test_nothing_to_draft_costs_exactly_plain_steps() -> None:
    reply = list(range(5000, 5400))  # no token repeats: no n-gram ever matches
    r = sim.simulate(PROMPT, reply, sim.H200_SMOLLM2, SETTINGS, warm=True)
    assert r["drafted"] == 0 and r["batches"] == {} and r["speedup"] == 1.0
    assert r["tokens"] == len(reply) - 1


def test_a_reply_in_the_draft_source_is_drafted_and_accepted() -> None:
    reply = list(range(5000, 5400))
    r = sim.simulate(PROMPT, reply, sim.H200_SMOLLM2, SETTINGS, warm=True, source=reply)
    assert r["acceptance"] == 1.0 and r["accepted"] == r["drafted"] > 300
    # every verify batch of 17 costs 3.139 steps back to back: the speedup is bounded by that
    assert 2.0 < r["speedup"] < 17 / 3.139
    assert r["batches"].get("17", 0) > 10


def test_batches_dearer_than_their_tokens_lose_little() -> None:
    """Where a verify batch of n tokens costs n + 1 steps nothing can be gained, even with
    every draft right: the cost model (or, should it be slow to learn, the guard) stops
    drafting after a few batches."""
    line = {1: 1.0, 2: 3.0, 17: 18.0}
    reply = list(range(5000, 5400))
    r = sim.simulate(PROMPT, reply, (line, line), SETTINGS, warm=True, source=reply)
    assert r["drafted"] > 0 and sum(r["batches"].values()) <= 6 and r["declined"] > 300
    assert 0.95 <= r["speedup"] < 1.0


def test_short_matches_that_mislead_cost_novel_text_nothing_much() -> None:
    """Novel code repeats short runs (`self.`, `return (`) whose continuation differs each
    time: a trigram that recurs every 8 tokens with a new continuation stays within the 0.97x
    that novel text may lose, on the H200's costs."""
    reply: list[int] = []
    fresh = iter(range(6000, 7000))
    for _ in range(50):
        reply += [1, 2, 3, *(next(fresh) for _ in range(5))]
    r = sim.simulate(PROMPT, reply, sim.H200_SMOLLM2, SETTINGS, warm=True)
    assert r["declined"] > 0  # there were drafts to take
    assert r["speedup"] >= 0.97


def test_the_live_stand_in_answers_from_the_reply() -> None:
    live = sim.RecordedLive(3, [7, 8, 9, 10, 11], sim.H200_SMOLLM2, max_draft=4, warm=False)
    live.append(7)
    assert live.sample(None) == 8 and len(live) == 4 and live.now == 1.0
    live.verify([8, 9, 99])  # the pending 8 and a draft: 9 right, 99 wrong
    assert [live.pick(None, 0), live.pick(None, 1)] == [9, 10]
    assert live.verified_sizes == {3} and live.now == 1.0 + sim.call_steps(sim.H200_SMOLLM2[1], 3)
    live.rollback(1)
    assert len(live) == 6


def test_turns_of_one_context_keep_its_costs_where_asked() -> None:
    """`--keep-costs`: the second turn of a context that keeps its cost model starts from the
    first turn's timings (a copy drafted from its first tokens); without it, each turn starts
    from the prior and declines drafts until the acceptance beats it."""
    reply = list(range(5000, 5400))
    declined = {}
    for keep in ("on", "off"):
        settings = SpeculationSettings(enabled=True, keep_costs=keep)
        context = sim.SimContext()
        first = sim.simulate(
            PROMPT, reply, sim.H200_SMOLLM2, settings, warm=True, source=reply, context=context
        )
        kept = context.spec_costs
        assert kept is not None and kept.measured  # the first turn timed its batches
        second = sim.simulate(
            PROMPT, reply, sim.H200_SMOLLM2, settings, warm=True, source=reply, context=context
        )
        assert (context.spec_costs is kept) == (keep == "on")
        assert second["acceptance"] == 1.0 and first["acceptance"] == 1.0
        declined[keep] = second["declined"]
    assert declined["on"] < declined["off"]


def test_a_copy_drafted_in_pairs_learns_its_continuation() -> None:
    """On a CPU a verify batch of 2 costs less than one token (SmolLM2 Q8_0: 0.82 steps), so a
    copy may be drafted one token at a time, which tests no continuation: left at its prior,
    the continuation would keep longer drafts priced out for good. The token sampled after an
    accepted draft tests the index's next drafted token as a longer draft would have, so the
    continuation is learnt from such batches too (here longer batches cost too much to take)."""
    pairs = {1: 1.0, 2: 0.82, 3: 4.0, 17: 30.0}
    reply = list(range(5000, 5400))
    live = sim.RecordedLive(len(PROMPT), reply, (pairs, pairs), SETTINGS.max_draft, warm=True)
    stepper = sim.SpecStepper(live, None, SETTINGS, [*PROMPT, *reply])  # type: ignore[arg-type]
    stepper.clock = lambda: live.now
    for n in (1, 1, 2, 2, 3, 3, 17, 17):  # each size timed twice: believed, and none untried
        stepper.cost.record(n, pairs[n])  # (the virtual clock counts one-token steps)
    prior = {n: stepper.acceptance.continuation(n) for n in range(3, 40)}
    token, produced = reply[0], 1
    while produced < 300:
        out = stepper.step(token, 399 - produced)
        produced += len(out)
        token = out[-1]
    assert stepper.counters.batches.get(2, 0) > 100 and set(stepper.counters.batches) == {2}
    learnt = {n for n in prior if stepper.acceptance.continuation(n) > max(prior[n], 0.95)}
    assert learnt, "no bucket's continuation moved from its prior"


def test_saved_replies_are_simulated_without_a_model(tmp_path: Path) -> None:
    """`--replies FILE` that exists: its recordings are simulated as they are, no model loaded
    (runs with other options compare the same texts)."""
    reply = list(range(5000, 5300))
    saved = tmp_path / "replies.json"
    saved.write_text(json.dumps({"novel": [PROMPT, reply, []], "replay": [PROMPT, reply, reply]}))
    out = subprocess.run(
        [
            sys.executable,
            str(_PATH),
            "--replies",
            str(saved),
            "--json",
            "--model",
            str(tmp_path / "none.gguf"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(out.stdout)
    assert list(rows) == ["novel", "replay"]
    assert rows["novel"]["drafted"] == 0 and rows["novel"]["speedup"] == 1.0
    assert rows["replay"]["acceptance"] == 1.0 and rows["replay"]["speedup"] > 2.0
