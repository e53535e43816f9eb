"""What the speculation stepper's own Python costs a token when nothing is drafted.

    python benchmarks/spec_stepper_python.py [--tokens 20000] [--rounds 4]

Novel text drafts little, so what speculation costs it is mostly the stepper's work around each
plain step: indexing the token, looking a draft up, timing the step. This runs the shipped
`SpecStepper` over a stand-in sequence (`devkit/spec_sim.py`) whose decode does nothing (random
tokens from a large vocabulary: nothing to draft; the session holds unrelated tokens), against
the engine's plain loop over the same stand-in, alternately, `--rounds` times, and prints µs a
token each way: the stepper's cost on a backend is that difference over the backend's one-token
step.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from velo_chat.engine.config import SpeculationSettings
from velo_chat.engine.diagnostics import SpecStepper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: devkit/
from devkit.spec_sim import StandInLive  # noqa: E402


def _per_token(text: Sequence[int], session: Sequence[int], stepper: bool) -> float:
    live = StandInLive(text)
    n = len(text) - 1
    token = text[0]
    if stepper:
        step = SpecStepper(live, None, SpeculationSettings(enabled=True), session)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        for _ in range(n):
            token = step.step(token, n)[-1]
    else:
        t0 = time.perf_counter()
        for _ in range(n):
            live.append(token)
            token = live.sample(None)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    rng = random.Random(1)
    text = [rng.randrange(49152) for _ in range(args.tokens + 1)]
    session = [rng.randrange(49152) for _ in range(2000)]
    runs: dict[str, list[float]] = {"plain loop": [], "stepper": []}
    for _ in range(args.rounds):
        runs["plain loop"].append(_per_token(text, session, False))
        runs["stepper"].append(_per_token(text, session, True))
    for name, us in runs.items():
        each = [round(u, 2) for u in us]
        print(f"{name:>10}: {statistics.median(us):6.2f} µs a token (median), runs {each}")
    extra = statistics.median(runs["stepper"]) - statistics.median(runs["plain loop"])
    print(f"the stepper adds {extra:.2f} µs a token with nothing drafted")


if __name__ == "__main__":
    main()
