"""`benchmarks/spec_stepper_python.py`: the shipped stepper over its stand-in sequence
(`devkit/spec_sim.StandInLive`, which must keep up with what `SpecStepper` reads from a live
sequence), and the script itself, run as a command."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

from devkit.spec_sim import StandInLive
from velo_chat.engine.config.profile_schema import SpeculationSettings
from velo_chat.engine.speculation.stepper import SpecStepper

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "spec_stepper_python.py"


def test_the_stepper_steps_the_stand_in_to_the_end() -> None:
    rng = random.Random(3)
    text = [rng.randrange(49152) for _ in range(301)]
    session = [rng.randrange(49152) for _ in range(200)]
    live = StandInLive(text)
    step = SpecStepper(live, None, SpeculationSettings(enabled=True), session)  # type: ignore[arg-type]
    token = text[0]
    for _ in range(300):
        token = step.step(token, 300)[-1]
    assert len(live) == 300 and token == text[300]  # every token decoded plainly, in order
    assert step.counters.rounds == 0 and step.counters.decode_calls == 300


def test_the_script_times_the_plain_loop_and_the_stepper() -> None:
    out = subprocess.run(
        [sys.executable, str(_PATH), "--tokens", "300", "--rounds", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    medians = dict(re.findall(r"^\s*(plain loop|stepper): +([0-9.]+) µs a token", out, re.MULTILINE))
    assert set(medians) == {"plain loop", "stepper"}, out
    assert all(float(us) > 0.0 for us in medians.values()), out
    assert "the stepper adds" in out
