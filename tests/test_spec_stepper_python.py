"""`benchmarks/spec_stepper_python.py`: the shipped stepper over its stand-in sequence (the
stand-in must keep up with what `SpecStepper` reads from a live sequence)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "spec_stepper_python.py"
_spec = importlib.util.spec_from_file_location("spec_stepper_python", _PATH)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_stepper_steps_the_stand_in_to_the_end() -> None:
    rng = random.Random(3)
    text = [rng.randrange(49152) for _ in range(301)]
    session = [rng.randrange(49152) for _ in range(200)]
    for stepper in (False, True):
        assert bench._per_token(text, session, stepper) > 0.0
    live = bench._StandIn(text)
    step = bench.SpecStepper(live, None, bench.SpeculationSettings(enabled=True), session)
    token = text[0]
    for _ in range(300):
        token = step.step(token, 300)[-1]
    assert len(live) == 300 and token == text[300]  # every token decoded plainly, in order
    assert step.counters.rounds == 0 and step.counters.decode_calls == 300
