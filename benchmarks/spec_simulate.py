"""The speculation stepper's decisions against a measured cost table, without a model.

    python benchmarks/spec_simulate.py [--tokens 512] [--seeds 5]

The cost model and the draft-length rule of `engine/speculation.py`, as shipped, decide each
step of a simulated reply; a step's time comes from SmolLM2's H200 table (`device_spec.sh`,
2026-12-01, every layer on the GPU): a call of n tokens costs its back-to-back time after a
call of its size (llama.cpp reuses the graph) and its after-another-size time otherwise (a new
graph). The text: a draft is available at a fraction of the steps, of one match length, and
each drafted token is right with probability q (independently). Prints the speedup over plain
steps for the shipped rule, the same without padding, and without the new-graph price either
("unpriced": the earlier rule's pricing, with today's timing of batches): what the rule does
on that backend, not a measurement.
"""

from __future__ import annotations

import argparse
import random

from velo_chat.engine.spec_cost import Acceptance, CostModel, best_draft_length

BACK_TO_BACK = {1: 1.0, 2: 1.14, 3: 1.315, 5: 1.426, 9: 2.978, 17: 3.591}
AFTER_ANOTHER = {1: 3.695, 2: 4.397, 3: 4.403, 5: 4.337, 9: 5.945, 17: 5.798}
STEP_S = 0.001  # a one-token step (its scale does not matter)


def _steps(table: dict[int, float], n: int) -> float:
    sizes = sorted(table)
    for lo, hi in zip(sizes, sizes[1:], strict=False):
        if lo <= n <= hi:
            return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
    return table[sizes[-1]]


def simulate(q: float, available: float, length: int, tokens: int, seed: int, rule: str) -> float:
    """Speedup over plain steps of one simulated reply. `rule`: "shipped", "no-pad" or "unpriced"."""
    rng = random.Random(seed)
    cost, acceptance = CostModel(0.8), Acceptance()
    if rule == "unpriced":
        cost.call_cost = lambda n, prev: cost.relative(n)  # type: ignore[method-assign]
    elapsed, out, prev, skip, backoff, k_max = 0.0, 0, 0, 0, 1, 16
    while out < tokens:
        has = rng.random() < available
        avail = (rng.randint(1, k_max) if length < 20 else k_max) if has else 0
        k = 0
        if has and skip == 0:
            last = cost.last if rule == "shipped" or cost.last == 1 else 0
            k = best_draft_length(acceptance.rate(length), k_max, cost, 1.05, available=avail, prev=last)
        n = k + 1
        seconds = STEP_S * _steps(BACK_TO_BACK if n == prev else AFTER_ANOTHER, n)
        cost.record(n, seconds)
        elapsed, prev = elapsed + seconds, n
        if k == 0:
            skip = max(skip - 1, 0)
            out += 1
            if has:
                acceptance.update(length, 1, int(rng.random() < q))
            continue
        drafted = min(k, avail)
        accepted = 0
        while accepted < drafted and rng.random() < q:
            accepted += 1
        out += accepted + 1
        acceptance.update(length, drafted, accepted)
        skip, backoff = (backoff, min(backoff * 2, 64)) if accepted == 0 else (skip, 1)
    return tokens * STEP_S / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    cases = [("copy", 0.995, 1.0, 32)]
    cases += [(f"L={n} q={q}", q, 0.5, n) for n in (8, 20, 32) for q in (0.3, 0.5, 0.7, 0.85, 0.95)]
    print(f"{'text':>14} {'shipped':>8} {'no pad':>8} {'unpriced':>9}")
    for name, q, available, length in cases:
        row = [
            sum(simulate(q, available, length, args.tokens, s, rule) for s in range(args.seeds)) / args.seeds
            for rule in ("shipped", "no-pad", "unpriced")
        ]
        print(f"{name:>14} " + " ".join(f"{v:>7.2f}x" for v in row[:2]) + f" {row[2]:>8.2f}x")


if __name__ == "__main__":
    main()
