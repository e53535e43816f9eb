"""Measurements of n-gram speculation on a backend, for `velo-chat bench --spec` and
`benchmarks/spec_logits.py` (the stepper itself is `stepper.py`).

- `verify_batch_costs`: what a verify batch of n tokens costs against one token, with the
  graph of its shape reused (back-to-back verifies) or built anew (after another size);
- `replay_decode`: a reply decoded plainly, then with speculation drafting from that reply,
  the best case a backend allows for any model (random weights included);
- `batch_logit_differences`: whether a verify batch's logits equal one-token decoding's.

Each works on the live sequence and leaves it empty.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.profile_schema import SpeculationSettings
from ..live_sequence import LiveSequence
from ..llama.sampling import Sampler
from .stepper import SpecCounters, SpecStepper


def verify_batch_costs(
    live: LiveSequence, prompt: Sequence[int], sizes: Sequence[int], repeats: int, *, alternate: bool = False
) -> dict[int, float]:
    """Median seconds of one verify batch (logits for every position) of each size that fits
    `max_draft`, after decoding `prompt`; each sample leaves one more token in the context.
    Each size is timed in a row after one untimed batch, so llama.cpp reuses the graph it built
    for that shape, as for back-to-back verify batches of one length; `alternate` cycles
    through the sizes instead, so every batch builds its graph anew, as for a verify after a
    plain step or another length. The benchmark sets these against one token
    (`velo-chat bench --spec`)."""
    live.clear()
    for pos in range(0, len(prompt), live.n_ubatch):
        live.extend(prompt[pos : pos + live.n_ubatch])
    filler = list(prompt[: max(sizes)])
    samples: dict[int, list[float]] = {n: [] for n in sizes if n - 1 <= live.max_draft and n <= len(filler)}

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        live.verify(filler[:n])
        live.synchronize()
        seconds = time.perf_counter() - t0
        live.rollback(n - 1)
        return seconds

    if alternate:
        for _ in range(repeats):
            for n, got in samples.items():
                got.append(timed(n))
    else:
        for n, got in samples.items():
            timed(n)
            got.extend(timed(n) for _ in range(repeats))
    live.clear()
    return {n: statistics.median(v) for n, v in samples.items()}


@dataclass
class ReplayResult:
    """Plain decoding against speculation drafting from the plain reply (`replay_decode`)."""

    tokens: int  # tokens decoded each way
    plain_s: float  # from the first sampled token to the last, plain
    spec_s: float  # the same with speculation
    identical: bool  # the same tokens both ways
    counters: SpecCounters = field(default_factory=SpecCounters)
    graphs_reused: int = 0  # llama.cpp graphs reused by the speculative run's decode calls
    plain: list[int] = field(default_factory=list)  # the tokens, plain
    spec: list[int] = field(default_factory=list)  # and with speculation
    # when each of those tokens was sampled (perf_counter; the first: when timing began)
    plain_times: list[float] = field(default_factory=list)
    spec_times: list[float] = field(default_factory=list)


def replay_decode(
    live: LiveSequence,
    sampler: Callable[[], Sampler],
    settings: SpeculationSettings,
    prompt: Sequence[int],
    n: int,
) -> ReplayResult:
    """Decode `n` tokens after `prompt` plainly, then again with speculation whose draft source
    also holds that plain reply, as if the session held the text the reply copies. This is the
    best case a backend allows whatever the model (a random-weight one never repeats text by
    itself): nearly every draft is accepted, and what is left is the verify batches' cost and
    the stepper's own. `sampler()` makes a fresh sampler chain (deterministic: greedy or
    seeded). The live sequence is empty afterwards."""

    def prefill() -> None:
        live.clear()
        for pos in range(0, len(prompt), live.n_ubatch):
            live.extend(prompt[pos : pos + live.n_ubatch])
        live.synchronize()

    prefill()
    clock = time.perf_counter
    with sampler() as s:
        plain = [live.sample(s)]
        plain_times = [clock()]
        while len(plain) < n:
            live.append(plain[-1])
            plain.append(live.sample(s))
            plain_times.append(clock())
        plain_s = plain_times[-1] - plain_times[0]
    prefill()
    with sampler() as s:
        stepper = SpecStepper(live, s, settings, [*prompt, *plain])
        out = [live.sample(s)]
        reused = live.perf().n_reused
        spec_times = [clock()]
        while len(out) < n:
            batch = stepper.step(out[-1], n - len(out))
            out.extend(batch)
            spec_times.extend([clock()] * len(batch))
        spec_s = spec_times[-1] - spec_times[0]
        reused = live.perf().n_reused - reused
    live.clear()
    counters = stepper.counters
    return ReplayResult(
        n, plain_s, spec_s, out == plain, counters, reused, plain, out[:n], plain_times, spec_times[:n]
    )


def batch_logit_differences(
    live: LiveSequence, prompt: Sequence[int], positions: int, sizes: Sequence[int]
) -> dict[str, Any]:
    """Whether a verify batch's logits equal one-token decoding's on this backend: after
    `prompt`, `positions` greedy tokens decoded one at a time (the logits of each kept), then
    verified again in batches of each size that fits `max_draft`, the prompt prefilled alike.
    The largest absolute logit difference and the argmax disagreements per batch size, and the
    smallest gap between the two best logits of the one-token chain (greedy output can only
    differ where a difference exceeds such a gap). The live sequence is empty afterwards."""

    def prefill() -> None:
        live.clear()
        for pos in range(0, len(prompt), live.n_ubatch):
            live.extend(prompt[pos : pos + live.n_ubatch])

    prefill()
    chain: list[int] = []
    ref = []
    for _ in range(positions):
        ref.append(live.logits())
        chain.append(int(ref[-1].argmax()))
        live.append(chain[-1])
    ref.append(live.logits())  # after the last chain token
    gaps = []
    for r in ref:
        second, first = r[r.argsort()[-2:]]
        gaps.append(float(first - second))
    diffs: dict[int, float] = {}
    differs: dict[int, int] = {}
    for b in (b for b in sizes if 1 < b and b - 1 <= live.max_draft):
        prefill()
        diffs[b], differs[b] = 0.0, 0
        for start in range(0, positions, b):
            batch = chain[start : start + b]
            live.verify(batch)
            for i in range(len(batch)):
                got, want = live.logits(i), ref[start + i + 1]
                diffs[b] = max(diffs[b], float(abs(got - want).max()))
                differs[b] += int(got.argmax() != want.argmax())
    live.clear()
    return {
        "positions": positions,
        "min_top2_gap": min(gaps),
        "max_abs_diff": diffs,
        "argmax_differs": differs,
    }
