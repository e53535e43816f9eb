"""The speculation stepper's decisions against a measured cost table, without a model.

    python benchmarks/spec_simulate.py [--tokens 512] [--seeds 5]

The cost model and the draft-length rule of `engine/speculation/stepper.py`, as shipped, decide each
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

from velo_chat.engine.speculation import cost as spec_cost
from velo_chat.engine.speculation.cost import Acceptance, CostModel, best_draft_length

TABLES = {
    # ggml-cuda's upstream graph key: every switch of shape captured a CUDA graph anew
    "upstream": (
        {1: 1.0, 2: 1.14, 3: 1.315, 5: 1.426, 9: 2.978, 17: 3.591},
        {1: 3.695, 2: 4.397, 3: 4.403, 5: 4.337, 9: 5.945, 17: 5.798},
    ),
    # packaging/patches/cuda-graph-per-shape.patch (2026-12-02)
    "per-shape": (
        {1: 1.0, 2: 1.127, 3: 1.173, 5: 1.275, 9: 2.798, 17: 3.139},
        {1: 1.685, 2: 1.79, 3: 1.833, 5: 1.934, 9: 3.461, 17: 3.794},
    ),
}
"""SmolLM2 Q4_1, every layer on an H200: a call of n tokens in one-token steps, after a call of
its size (graph reused) and after one of another size (`device_spec.sh`)."""
STEP_S = 0.001  # a one-token step (its scale does not matter)


def _with_step(table: dict[int, float], last_cheap: int) -> dict[int, float]:
    """`table` with the sizes up to `last_cheap` on the line through 3 and 5 (a hypothesis:
    ggml-cuda's matrix-vector kernel takes up to 8 columns, so 6-8 cost about what 5 does)."""
    slope = (table[5] - table[3]) / 2
    return {**table, **{n: table[5] + slope * (n - 5) for n in range(6, last_cheap + 1)}}


def _steps(table: dict[int, float], n: int) -> float:
    sizes = sorted(table)
    for lo, hi in zip(sizes, sizes[1:], strict=False):
        if lo <= n <= hi:
            return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
    return table[sizes[-1]]


Tables = tuple[dict[int, float], dict[int, float]]


def simulate(
    q: float, available: float, length: int, tokens: int, seed: int, rule: str, tables: Tables
) -> float:
    """Speedup over plain steps of one simulated reply. `rule`: "shipped", "no-probe" (no
    sizes probed inside a step), "no-pad" or "unpriced"."""
    rng = random.Random(seed)
    cost, acceptance = CostModel(0.8), Acceptance()
    back_to_back, after_another = tables
    if rule != "shipped":
        cost.probes = spec_cost.MAX_PROBES
    if rule == "unpriced":
        cost.call_cost = lambda n, prev: cost.relative(n)  # type: ignore[method-assign]
    elapsed, out, prev, skip, backoff, k_max = 0.0, 0, 0, 0, 1, 16
    while out < tokens:
        has = rng.random() < available
        avail = (rng.randint(1, k_max) if length < 20 else k_max) if has else 0
        k = 0
        if has and skip == 0:
            last = cost.last if rule != "no-pad" or cost.last == 1 else 0
            k = best_draft_length(acceptance.rate(length), k_max, cost, 1.05, available=avail, prev=last)
        n = k + 1
        seconds = STEP_S * _steps(back_to_back if n == prev else after_another, n)
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
    ap.add_argument("--table", choices=sorted(TABLES), default="upstream")
    ap.add_argument(
        "--cheap-up-to", type=int, default=0, help="sizes 6..N cost about what 5 does (a hypothesis)"
    )
    args = ap.parse_args()
    tables = TABLES[args.table]
    if args.cheap_up_to:
        tables = (_with_step(tables[0], args.cheap_up_to), _with_step(tables[1], args.cheap_up_to))
    cases = [("copy", 0.995, 1.0, 32)]
    cases += [(f"L={n} q={q}", q, 0.5, n) for n in (8, 20, 32) for q in (0.3, 0.5, 0.7, 0.85, 0.95)]
    rules = ("shipped", "no-probe", "no-pad", "unpriced")
    print(f"{'text':>14} " + " ".join(f"{r:>9}" for r in rules))
    for name, q, available, length in cases:
        row = [
            sum(simulate(q, available, length, args.tokens, s, rule, tables) for s in range(args.seeds))
            / args.seeds
            for rule in rules
        ]
        print(f"{name:>14} " + " ".join(f"{v:>8.2f}x" for v in row))


if __name__ == "__main__":
    main()
