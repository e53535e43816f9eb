"""When a speculative draft pays: what a verify batch costs against a one-token step
(`CostModel`, timed live), how likely a draft of a given match length is to be accepted
(`Acceptance`), and the draft length with the most expected tokens per unit of time
(`best_draft_length`). `engine/speculation/stepper.py`'s stepper asks these before every step.

Drafting pays only where a batch of n tokens costs less than n one-token steps times the tokens
it is expected to yield; on a GPU a new graph when the batch size changes is the largest cost
(docs/speculation.md)."""

from __future__ import annotations

import bisect
from collections.abc import Callable

MATCH_BUCKETS = (3, 5, 8, 12, 20, 32)
"""Match-length buckets (lower bounds) that keep their own acceptance estimate: a 30-token match
predicts the next token far better than a 3-token one."""


MAX_SLOPE_SAMPLE = 2.0
"""The most one timed batch may say each extra token costs, in one-token steps. A batch that
took far longer was descheduled or waited for something else; uncapped, one such sample priced
drafts out for the rest of the turn, and with no drafts nothing would ever be timed again."""

STEP_RATIO = 3.0
"""A stretch between two timed batch sizes whose cost per token is at least this many times its
neighbours' holds a step: a backend switching kernels at a batch size (ggml-cuda multiplies a
quantized matrix by at most 8 columns with its matrix-vector kernel, by more with the
matrix-matrix one, so a batch of 9 costs far more than one of 8)."""

STEP_MIN = 0.5
"""...and rises by at least this many one-token steps (below it the rise is noise)."""

MAX_PROBES = 4
"""Sizes a turn may time inside steps (each probe may cost up to the step's rise once)."""

MAX_REBUILD_SAMPLE = 5.0
"""The most one timed step may say a new graph costs, in one-token steps (above what a GPU with
every layer on it times), for the same reason as `MAX_SLOPE_SAMPLE`."""

MAX_STALE_SAMPLE = 8.0
"""The same for a stale graph (`CostModel.stale`)."""


class CostModel:
    """What a decode call of n tokens costs against a one-token step, and what it costs more
    when its shape differs from the previous call's.

    Each batch size keeps its own measured cost (an exponential moving average of its time over
    the one-token time's); a size between two measured ones is interpolated between them, and
    the sizes below the smallest measured are read off a line fitted through the batch sizes
    alone. Not through the one-token step: a batch takes another path than a token (logits
    and sampling for every position; on a GPU other kernels), so a
    batch of two costs much more than a token while each further token adds little. One slope
    through the one-token step, learnt at the short drafts a turn starts with, would price a
    long batch far too high and stop drafting where a long draft pays.

    llama.cpp keeps one graph and reuses it while the batch shape stays the same; a call of another
    size than the previous one builds its graph anew (`rebuild`, in one-token steps). On the CPU
    that is small against a step; with every layer on a GPU it dominates: a one-token step after a
    verify batch, and a short verify after a plain step, cost several steps where the same calls
    back to back cost about one. `rebuild` is timed live from the one-token steps that follow a
    verify batch, and the batch sizes' own costs are what is left of a batch's time after it.

    Beyond the largest size measured the cost is taken as that size's (optimistic): where the
    acceptance is high enough for that to pay, the longest draft is tried and so measured, and
    the line then says what it costs. Before any batch is measured the profile's
    `batch_cost_prior` prices each extra token. A size timed once is priced no dearer than the
    prior, and at its second timing the lower of the two counts: the first batch of a size may
    pay an allocation, a GPU backend may load kernels, or a batch may be descheduled, and believed, one
    such time priced drafts out for the rest of the turn. (The first batch of each size used
    to be dropped instead; with new graphs priced, that kept a turn on the prior too long.)

    **Steps.** A backend's cost is not a line: it switches kernels at batch sizes (ggml-cuda at 8
    columns for quantized weights). Between two timed sizes whose cost per token is `STEP_RATIO`
    times their neighbours' (and rises by `STEP_MIN` steps or more) there is a step somewhere;
    interpolated, a size just below it looks dear and is never tried (on a GPU, 8 tokens priced
    between 5 and 9 would read far dearer than they cost). The powers of two inside such a stretch
    are priced as the lower end plus the neighbours' slope, so where that pays the draft length rule
    tries one, it is timed, and the stretch narrows: a search that finds the cheap power of two
    below a step in a verify batch or two, at most `MAX_PROBES` a turn. (A bisection probes the
    middle of the stretch, which a longer draft may beat, so the size below the step is never
    tried.) On a CPU, whose cost grows about evenly, no stretch stands out and nothing is probed.

    **Stale graphs.** llama.cpp pads the attention's KV length to a window of 256 cells, so a call
    whose context end lies in another window than the last call of its size had finds its graph's
    shapes changed (`LiveSequence.graph_stale`): the graph is built anew and a GPU backend runs it
    eagerly while capturing its CUDA graph again. Plain decoding pays that once every 256 tokens; a
    verify batch of a size used now and then (novel text: a draft here and there) pays it nearly
    every time, and on a GPU a stale verify costs several steps more than one built anew at the same
    window. `stale` is that extra cost, in one-token steps, timed from the one-token steps that are
    stale (they are left out of the one-token time, which one such step used to lift by half for the
    next few steps); a stale batch is priced `stale` more instead of a new graph's `rebuild`, and
    its own cost is what is left of its time after it. On a CPU a stale step costs a graph build, a
    fraction of a step.

    **Across turns.** Where `speculation.keep_costs` says so (by default with every layer on a GPU:
    `stepper.turn_costs`), the context keeps its cost model (`LiveSequence.spec_costs`): a
    turn starts from what earlier turns timed (`begin_turn`), not from the prior alone, so its
    first draft is priced with the new graphs it builds (a GPU turn's first drafts, priced by
    the prior alone, are its costliest steps). What an earlier turn timed is carried,
    not trusted. A carried size is priced no dearer than the prior: a batch's cost relative to
    a one-token step depends on the context's length (on a CPU a verify row's attention walks
    the whole cache), so a size timed in a long turn would overprice it in a short one and keep
    the short turn on short drafts. A turn's first
    timing of a size, and its first timing of a new graph, replace the carried value outright
    (a cost timed high once, on a busy machine, would otherwise move back only a fifth of the
    way a sample). And where the carried costs decline a run of drafts that were right, the
    stepper verifies one anyway so that it is timed again (`stepper.EXPLORE_STREAK`): a
    new graph's cost is not capped by any prior."""

    def __init__(self, slope: float = 0.5, alpha: float = 0.2, stale: float | None = None) -> None:
        self.prior = slope
        self.alpha = alpha
        self._one: float | None = None
        self._steady = False  # `_one` timed from a step that followed a step
        self.measured: dict[int, float] = {}  # batch size -> its cost in one-token steps
        self._line = (1.0 - slope, slope)  # relative(n) = a + b * n between measured sizes
        self._top = 0  # the largest size measured
        self.rebuild = 0.0  # what a call of a new shape costs more, in one-token steps
        # what a call whose graph is stale costs more, in one-token steps (None: not timed yet;
        # a context keeps its cost model, this with it: `LiveSequence.spec_costs`)
        self.stale = stale
        # until `rebuild` is first timed: the sizes timed only after another size (their cost
        # holds a new graph's); None afterwards
        self._switched_only: set[int] | None = set()
        self._reused: set[int] = set()  # sizes timed right after a batch of their size
        self._single: set[int] = set()  # sizes timed once (counted) so far
        self._priced: dict[int, float] = {}  # the costs the line is fitted through
        self._sizes: list[int] = []  # the sizes of `_priced`, ascending
        self._cheapest = 1.0 + slope  # no batch of 2+ tokens costs less (`floor`)
        self._probe: dict[int, float] = {}  # a size to try inside a step's stretch -> its price
        self.probes = 0  # sizes first timed as such a try
        self.last = 0  # the size of the previous call (0: none yet; the prefill's shape)
        self._carried: set[int] = set()  # sizes whose cost an earlier turn timed, not this one
        self._rebuild_carried = False  # `rebuild` is an earlier turn's, not timed in this one

    def begin_turn(self, prior: float) -> None:
        """Start a turn in the context that timed these costs: the one-token time is timed
        again (the context has grown); every size's cost (no dearer than the prior) and
        `rebuild` are the turn's first prices, each until the turn times it once (then that
        timing replaces it); and `prior` (the profile's `batch_cost_prior`, which a settings
        change may have moved) prices the sizes not timed yet."""
        self.prior = prior
        self._one, self._steady, self.last, self.probes = None, False, 0, 0
        self._carried = set(self.measured)
        self._reused = set()
        if self._switched_only is None:  # timed: priced as it was until the turn times it
            self._rebuild_carried, self._switched_only = True, set()
        if self.measured:
            self._fit()
        else:
            self._line, self._cheapest = (1.0 - prior, prior), 1.0 + prior

    @property
    def carried(self) -> bool:
        """Whether some cost the turn prices with is an earlier turn's, not timed in this one."""
        return bool(self._carried) or self._rebuild_carried

    @property
    def step_seconds(self) -> float | None:
        """A one-token step's time (its graph reused once one step has followed another)."""
        return self._one

    def record(self, n: int, seconds: float, stale: bool = False) -> None:
        """Time a decode call of `n` tokens; `stale`: its graph was stale
        (`LiveSequence.graph_stale`)."""
        prev, self.last = self.last, n
        if n == 1 and stale:
            if self._one and self._steady:  # what a stale graph costs; not a one-token time
                r = min(max(seconds / self._one - 1.0, 0.0), MAX_STALE_SAMPLE)
                self.stale = r if self.stale is None else self.stale + self.alpha * (r - self.stale)
            elif self._one is None:
                self._one = seconds
            return
        if n == 1:
            if prev == 1:  # a step after a step: its graph reused
                steady, self._steady = self._steady, True
                self._one = (
                    self._one + self.alpha * (seconds - self._one) if steady and self._one else seconds
                )
            elif self._one is None:  # a first guess (a new graph included) until a step follows one
                self._one = seconds
            elif prev and self._steady:  # after a verify batch: the one-token graph built anew
                r = min(max(seconds / self._one - 1.0, 0.0), MAX_REBUILD_SAMPLE)
                if self._switched_only is None:
                    self.rebuild += self.alpha * (r - self.rebuild)
                else:  # the turn's first (an earlier turn's is replaced): take it out of the
                    # sizes timed only after another size
                    self.rebuild, sizes, self._switched_only = r, self._switched_only, None
                    self._rebuild_carried = False
                    for size in sizes:
                        self.measured[size] = max(self.measured[size] - r, 0.5)
                    if sizes:
                        self._fit()
        elif self._one:
            pending = self._switched_only
            # until the turn times a new graph, a batch after another size keeps that graph's
            # cost in its own, taken out once timed (a carried `rebuild` prices, not this)
            rebuild = 0.0 if pending is not None else self.rebuild
            if stale:  # built anew and captured again: what is left after `stale` is its own
                self._batch(n, seconds / self._one - max(self.stale or 0.0, rebuild))
                if pending is not None and n not in self._reused:
                    pending.add(n)
            elif n == prev:
                self._batch(n, seconds / self._one)
                if pending is not None:
                    pending.discard(n)
            else:
                self._batch(n, seconds / self._one - rebuild)
                if pending is not None and n not in self._reused:
                    pending.add(n)
            if n == prev:
                self._reused.add(n)

    def _batch(self, n: int, relative: float) -> None:
        r = min(max(relative, 0.5), 1.0 + MAX_SLOPE_SAMPLE * (n - 1))
        old = self.measured.get(n)
        if n in self._carried:  # an earlier turn's: this turn's first timing replaces it
            self._carried.discard(n)
            old = None
        if old is None and n in self._probe:
            self.probes += 1
        if old is None:  # one sample: priced no dearer than the prior until a second one
            self._single.add(n)
            self.measured[n] = r
        elif n in self._single:  # the lower of the first two (one may have been descheduled)
            self._single.discard(n)
            self.measured[n] = min(old, r)
        else:
            self.measured[n] = old + self.alpha * (r - old)
        self._fit()

    def _fit(self) -> None:
        capped = self._single | self._carried  # priced no dearer than the prior
        pts = {n: min(r, 1.0 + self.prior * (n - 1)) if n in capped else r for n, r in self.measured.items()}
        self._priced = pts
        self._top = max(pts)
        self._cheapest = min(1.0, *pts.values())
        self._sizes = sorted(pts)
        self._probe = self._steps() if self.probes < MAX_PROBES else {}
        if len(pts) == 1:  # one size: the line through it and the one-token step
            ((m, r),) = pts.items()
            b = max((r - 1.0) / (m - 1), 0.0)
            self._line = (1.0 - b, b)
            return
        mean_n = sum(pts) / len(pts)
        mean_r = sum(pts.values()) / len(pts)
        var = sum((n - mean_n) ** 2 for n in pts)
        b = max(sum((n - mean_n) * (r - mean_r) for n, r in pts.items()) / var, 0.0)
        self._line = (mean_r - b * mean_n, b)

    def _steps(self) -> dict[int, float]:
        """The sizes to try inside each stretch between timed sizes that holds a step
        (`STEP_RATIO`), priced as its lower end plus the neighbouring stretches' cost per token:
        its powers of two, where backends switch kernels (ggml-cuda's matrix-vector kernel takes
        up to 8 columns; its tiles are multiples of 8 and 16)."""
        xs, pts = self._sizes, self._priced
        slopes = [(pts[b] - pts[a]) / (b - a) for a, b in zip(xs, xs[1:], strict=False)]
        probes: dict[int, float] = {}
        for i, s in enumerate(slopes):
            a, b = xs[i], xs[i + 1]
            near = slopes[max(i - 1, 0) : i] + slopes[i + 1 : i + 2]
            if b - a < 2 or not near or pts[b] - pts[a] < STEP_MIN:
                continue
            flat = max(min(near), 0.0)
            if s >= STEP_RATIO * max(max(near), 1e-6):
                for n in (2**e for e in range(1, b.bit_length()) if a < 2**e < b):
                    probes[n] = pts[a] + flat * (n - a)
        return probes

    def relative(self, n: int) -> float:
        """Cost of a batch of `n` over a one-token step, its graph reused."""
        if n <= 1:
            return 1.0
        top = self._top
        if not top:
            return 1.0 + self.prior * (n - 1)
        pts = self._priced
        if n >= top:
            return pts[top]
        if n in pts:
            return pts[n]
        if n in self._probe:
            return self._probe[n]
        xs = self._sizes
        i = bisect.bisect(xs, n)
        if i == 0:  # below the smallest timed size: the line, no dearer than that size
            a, b = self._line
            return min(max(a + b * n, 1.0), pts[xs[0]])
        lo, hi = xs[i - 1], xs[i]
        return pts[lo] + (pts[hi] - pts[lo]) * (n - lo) / (hi - lo)

    def floor(self, prev: int) -> float:
        """No verify batch after a call of `prev` tokens costs less than this (`call_cost`'s
        lower bound over every size and either graph state): `relative` never goes below the
        cheapest timed size or a one-token step, and leaving plain steps pays both new graphs."""
        if not self.measured:
            return self._cheapest
        return self._cheapest + (2.0 * self.rebuild if prev <= 1 else 0.0)

    def call_cost(self, n: int, prev: int, stale: bool = False) -> float:
        """Cost of a verify batch of `n` right after a call of `prev` tokens, in one-token
        steps: its own, a new graph unless `prev` was the same size, and, when it leaves plain
        steps (`prev` 1, or 0 at a turn's start), the new graph of the plain step that will
        follow the verify run, which staying plain would not pay. Until a batch size has been
        timed the prior alone prices it: with both new graphs priced in, a CPU's prior would
        keep a GPU turn from ever timing a batch, and a copy from most of its gain. `stale`: the
        batch's graph is stale, which costs `stale` (once timed) in place of a new graph's
        `rebuild`."""
        cost = self.relative(n)
        if not self.measured:  # nothing timed yet: the prior alone, so batches get timed
            return cost
        if stale:
            cost += max(self.stale or 0.0, self.rebuild)
        elif n != prev:
            cost += self.rebuild
        if prev <= 1:
            cost += self.rebuild
        return cost


class Acceptance:
    """Per match-length bucket, two probabilities (successes over trials, decayed so they follow
    the text): that a draft's first token is accepted (`rate`), and that a token after an
    accepted one is (`continuation`).

    Kept apart because they are learnt from different evidence and differ where it matters. A
    declined draft tests only its first token (the plain step says whether it was right); only
    a verify batch tests what follows. In novel code a short match's next token is often right
    (an identifier, a closing bracket) and what follows it seldom, so one rate for both, learnt
    mostly from declined drafts, drafts long batches of which only the first few tokens are
    accepted. A copy's first and later tokens are both
    right, so apart or together its drafts price alike. Each verify batch decays and updates
    both, a declined draft only the first (so the continuation keeps what the last batches
    said however many declined drafts came between). Where a batch's drafts were all accepted
    the stepper counts the token sampled after them against the index's next drafted token, as
    a draft one longer would have been tested: otherwise a copy drafted one token at a time
    (on a CPU a batch of 2 costs less than a step) would never test its continuation, and the
    prior would keep longer drafts priced out."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        # prior: two trials each; long matches start optimistic, short ones doubtful
        self._first = {b: [2.0 * _prior(i), 2.0] for i, b in enumerate(MATCH_BUCKETS)}
        self._next = {b: [2.0 * _prior(i), 2.0] for i, b in enumerate(MATCH_BUCKETS)}

    @staticmethod
    def bucket(length: int) -> int:
        b = MATCH_BUCKETS[0]
        for lo in MATCH_BUCKETS:
            if length >= lo:
                b = lo
        return b

    def rate(self, length: int) -> float:
        """That a draft's first token, after a match of `length`, is accepted."""
        s, n = self._first[self.bucket(length)]
        return s / n

    def continuation(self, length: int) -> float:
        """That a drafted token after an accepted one is accepted too."""
        s, n = self._next[self.bucket(length)]
        return s / n

    def update(self, length: int, drafted: int, accepted: int) -> None:
        """`drafted` tokens of a match of `length` were tested, the first `accepted` of them
        right (a declined draft: 1 drafted, tested by the plain step)."""
        b, d = self.bucket(length), self.decay
        first = self._first[b]
        first[0], first[1] = first[0] * d + (accepted > 0), first[1] * d + 1.0
        if drafted > 1 and accepted > 0:  # the tokens after the first were tested too
            nxt = self._next[b]
            nxt[0] = nxt[0] * d + accepted - 1
            nxt[1] = nxt[1] * d + accepted - 1 + (accepted < drafted)


def _prior(i: int) -> float:
    """The `i`-th match bucket's prior acceptance: from 0.3 for the shortest to 0.9."""
    return 0.3 + 0.6 * i / (len(MATCH_BUCKETS) - 1)


def best_draft_length(
    a: float,
    k_max: int,
    cost: CostModel,
    gain: float,
    *,
    then: float | None = None,
    available: int | None = None,
    prev: int = 1,
    stale: Callable[[int], bool] | None = None,
) -> int:
    """The draft length with the most expected tokens per unit of time, or 0 when no length
    beats a plain step by the factor `gain`. `a`: the acceptance of a draft's first token;
    `then`: of each token after an accepted one (`Acceptance.continuation`; None: `a`).
    Verifying k drafts yields 1 + a(1 + t + ... + t^(k-1)) tokens (the pending token's
    successor always, each draft only if all before it were accepted), for
    `cost.call_cost(k + 1, prev)`. Past the `available` draft tokens a batch is padded: no
    more tokens, but the size of the previous verify batch (`prev`) reuses its graph, which on
    a GPU costs less than a smaller batch built anew. `stale(n)`: whether a batch of n would
    find its graph stale (`LiveSequence.graph_stale`).

    A bound comes first: no draft yields more than 1 + a(1 + ... + t^(real-1)) tokens and no call
    costs less than `cost.floor(prev)`. Novel text asks this at most of its steps (code repeats
    short runs: a draft of a 3-token match, seldom right), and on a GPU, where leaving plain
    steps costs two new graphs, the bound declines it without pricing each length."""
    best_k, best = 0, 1.0 * gain
    t = a if then is None else then
    real = k_max if available is None else min(available, k_max)
    most = 1.0 + a * ((1.0 - t**real) / (1.0 - t) if t < 1.0 else float(real))
    if most * (1.0 + 1e-9) <= best * cost.floor(prev):  # (the margin: the sums' rounding)
        return 0
    expected, p = 1.0, a  # p: that the k-th draft is accepted, with every one before it
    for k in range(1, k_max + 1):
        if k <= real:
            expected += p
            p *= t
        elif k + 1 != prev or prev not in cost.measured:
            continue  # padding pays only to keep the previous batch's size, timed
        value = expected / cost.call_cost(k + 1, prev, stale(k + 1) if stale else False)
        if value > best:
            best_k, best = k, value
    return best_k
