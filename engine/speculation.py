"""Exact n-gram speculation: drafts from text already in the session, verified in one batch.

A reply that copies text from the conversation (an edited file given back whole, a renamed
identifier, a quoted function) repeats tokens the session already holds. `NgramIndex` finds the
longest recent n-gram that ends the session's tokens and proposes what followed it last time;
`SpecStepper` decodes the pending token and the draft in one `llama_decode` with logits for
every position (`LiveSequence.verify`), samples each position in order with the turn's own
sampler chain, keeps the agreeing prefix and rolls the rest back (`LiveSequence.rollback`).

Why the output is unchanged (docs/speculation.md):

- The sampler chain samples every position exactly as the one-token loop would: the same
  chain, the same order, one draw per emitted token, so its history (repeat penalty) and its
  random stream (temperature > 0, fixed seed) advance alike.
- A drafted token x is accepted when the token sampled at its position is x. With temperature
  0 that is the argmax test. With temperature > 0 the sample y ~ p equals x with probability
  p(x), and given y != x it is distributed as p with x removed and renormalised: exactly the
  speculative-sampling rule for a deterministic draft, so the output distribution is p.
- What remains is whether a batch's logits equal one token's. On the CPU backend with the
  quantized weights measured (SmolLM2 Q4_1) they are bit-identical; where a backend computes a
  batch with other kernels (a GPU: up to 2.9 for SmolLM2 on an H200) or another algorithm (the
  hybrid models' chunked recurrence) they differ, and greedy output is then identical only up
  to the first token where the two best logits are closer than that. So the engine speculates
  there only when the profile accepts that (`allow_batch_rounding`; `exactness` and
  `speculation_mode` below decide, the load message says which; docs/speculation.md).

Cost control: drafting only pays where a batch of n tokens costs less than n one-token steps
times the tokens it is expected to yield. The stepper keeps the measured time of each batch size,
what a new graph costs when the batch size changes (on a GPU the largest cost), and an
acceptance estimate per match length, drafts the length with the best expected tokens per unit
of time (padding a short draft to the last batch's size where that graph is cheaper to reuse),
and does not draft at all when none beats a plain step (novel text).

What `velo-chat bench --spec` measures with it (verify-batch costs, the replay of a reply,
batch against one-token logits) is in `spec_measure.py`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from .config.profile_schema import SpeculationSettings
from .live_sequence import LiveSequence
from .sampling import Sampler

MATCH_BUCKETS = (3, 5, 8, 12, 20, 32)
"""Match-length buckets (lower bounds) that keep their own acceptance estimate: a 30-token match
predicts the next token far better than a 3-token one."""

MAX_MATCH_CHECK = 32
"""How far back a match found by its hash is compared to measure its real length."""

NGRAM_SIZES = (4, 6, 8)
"""The n-gram sizes indexed besides `min_match` (fewer sizes: less work per token; a longer
match is found through its last 8, 6 or 4 tokens and then measured)."""


CUDA_OFFLOAD_BATCH = 32
"""ggml's CUDA backend computes a batch of this many tokens or more on the GPU even for layers
whose weights stay in host memory (it copies them over), so on a CUDA build a verify batch
that large is a GPU batch whatever `n_gpu_layers` says."""


def exactness(*, gpu_build: bool, gpu_layers: bool, hybrid: bool, max_draft: int) -> str:
    """Why a verify batch's logits may differ from one-token steps' on this setup, in words;
    "" where they are bit-identical by construction (every layer on the CPU backend, whose
    quantized dot products are the same whatever the batch size, and an attention model)."""
    why = []
    if gpu_layers:
        why.append("layers on a GPU, which computes a batch with other kernels than one token")
    elif gpu_build and max_draft + 1 >= CUDA_OFFLOAD_BATCH:
        why.append(f"a GPU build computes batches of {CUDA_OFFLOAD_BATCH}+ tokens on the GPU")
    if hybrid:
        why.append("a hybrid model's recurrence takes its chunked path for a batch")
    return "; ".join(why)


def speculation_mode(settings: SpeculationSettings, rounding: str) -> tuple[bool, str]:
    """Whether speculation may draft on this setup (its settings and `exactness`), and its
    guarantee in words (the model's load message): bit-identical to plain decoding, or the same
    model up to the backend's batch rounding where `allow_batch_rounding` accepts that."""
    allowed = not rounding or settings.allow_batch_rounding
    if not settings.enabled:
        return allowed, "off"
    if not rounding:
        return True, "on: bit-identical to plain decoding"
    if allowed:
        return True, f"on: plain decoding up to the batch rounding ({rounding})"
    return False, (
        f"off: a verify batch would round differently from one-token steps ({rounding}); "
        "speculation.allow_batch_rounding accepts that"
    )


class NgramIndex:
    """Where each n-gram of a token sequence last occurred, for n in `min_n` and the sizes of
    `NGRAM_SIZES` above it.

    `add(token)` is a few dict updates; `draft(k)` looks the sequence's suffix up, longest n
    first, and measures the match back up to `MAX_MATCH_CHECK` tokens. Keys are Python hashes
    of the n-gram tuples; a hash collision is caught by comparing the tokens before a match is
    used, and entries that point past the end (after `truncate`) are ignored."""

    def __init__(self, min_n: int) -> None:
        self.sizes = tuple(sorted({min_n, *(n for n in NGRAM_SIZES if n > min_n)}))
        self._longest_first = self.sizes[::-1]
        self.tokens: list[int] = []
        self._next: dict[int, int] = {}  # hash(n-gram) -> index of the token that followed it

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.add(t)

    def add(self, token: int) -> None:
        toks = self.tokens
        end = len(toks)  # n-grams ending here are followed by `token`
        for n in self.sizes:
            if n > end:
                break
            self._next[hash((n, *toks[end - n : end]))] = end
        toks.append(token)

    def truncate(self, n: int) -> None:
        """Forget the tokens after the first `n`."""
        del self.tokens[n:]

    def draft(self, k: int) -> tuple[list[int], int]:
        """Up to `k` tokens predicted to follow the sequence, from the longest n-gram that ends
        it and occurred before; and the length of that match. ([], 0) when there is none."""
        toks = self.tokens
        end = len(toks)
        for n in self._longest_first:
            if n >= end:
                continue
            suffix = toks[end - n : end]
            j = self._next.get(hash((n, *suffix)))
            if j is None or j >= end or toks[j - n : j] != suffix:
                continue
            length = n  # measure the whole match
            while (
                length < MAX_MATCH_CHECK
                and j - length - 1 >= 0
                and toks[j - length - 1] == toks[end - length - 1]
            ):
                length += 1
            return toks[j : j + k], length
        return [], 0


@dataclass
class SpecCounters:
    """A turn's speculation numbers (TurnStats carries them)."""

    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # of those, accepted
    rounds: int = 0  # verify batches
    padded: int = 0  # tokens added to verify batches only to keep the previous batch's size
    decode_calls: int = 0  # llama_decode calls of the decode phase (verify batches included)


MAX_SLOPE_SAMPLE = 2.0
"""The most one timed batch may say each extra token costs, in one-token steps. A batch that
took far longer was descheduled or waited for something else; uncapped, one such sample priced
drafts out for the rest of the turn, and with no drafts nothing would ever be timed again."""

MAX_REBUILD_SAMPLE = 5.0
"""The most one timed step may say a new graph costs, in one-token steps (measured on an H200:
2.7-3.9 with every layer on the GPU), for the same reason as `MAX_SLOPE_SAMPLE`."""


class CostModel:
    """What a decode call of n tokens costs against a one-token step, and what it costs more
    when its shape differs from the previous call's.

    Each batch size keeps its own measured cost (an exponential moving average of its time over
    the one-token time's), and the sizes between and below those measured are read off a line
    fitted through the batch sizes alone. Not through the one-token step: a batch takes another
    path than a token (logits and sampling for every position; on a GPU other kernels), so a
    batch of two costs much more than a token while each further token adds little. Measured on
    the CPU (SmolLM2): 2 tokens 2.06 steps, 17 tokens 10.7; one slope through the one-token step,
    learnt at the short drafts a turn starts with, said 1.06 a token, priced the 17-token batch
    at 18 steps and stopped drafting where 17 tokens for 10.7 steps was a 1.6x gain.

    llama.cpp keeps one graph and reuses it while the batch shape stays the same; a call of
    another size than the previous one builds its graph anew (`rebuild`, in one-token steps).
    On the CPU that is small (SmolLM2: well under a step; the tiny qwen4exp's 0.2 ms step about
    doubles); on an H200 with every layer on the GPU it dominates: a one-token step after a
    verify batch costs 3.1-4.9 steps, a verify of 2 tokens after a plain step 3.5-4.9 against
    1.14 back to back. `rebuild` is timed live from the one-token steps that follow a verify
    batch, and the batch sizes' own costs are what is left of a batch's time after it.

    Beyond the largest size measured the cost is taken as that size's (optimistic): where the
    acceptance is high enough for that to pay, the longest draft is tried and so measured, and
    the line then says what it costs. Before any batch is measured the profile's
    `batch_cost_prior` prices each extra token. A size timed once is priced no dearer than the
    prior, and at its second timing the lower of the two counts: the first batch of a size may
    pay an allocation, a GPU backend may load kernels (measured: the first two-token verify of
    a turn took over ten steps on the CPU), or a batch may be descheduled, and believed, one
    such time priced drafts out for the rest of the turn. (The first batch of each size used
    to be dropped instead; with new graphs priced, that kept a turn on the prior too long.)"""

    def __init__(self, slope: float = 0.5, alpha: float = 0.2) -> None:
        self.prior = slope
        self.alpha = alpha
        self._one: float | None = None
        self._steady = False  # `_one` timed from a step that followed a step
        self.measured: dict[int, float] = {}  # batch size -> its cost in one-token steps
        self._line = (1.0 - slope, slope)  # relative(n) = a + b * n between measured sizes
        self._top = 0  # the largest size measured
        self.rebuild = 0.0  # what a call of a new shape costs more, in one-token steps
        # until `rebuild` is first timed: the sizes timed only after another size (their cost
        # holds a new graph's); None afterwards
        self._switched_only: set[int] | None = set()
        self._reused: set[int] = set()  # sizes timed right after a batch of their size
        self._single: set[int] = set()  # sizes timed once (counted) so far
        self._priced: dict[int, float] = {}  # the costs the line is fitted through
        self.last = 0  # the size of the previous call (0: none yet; the prefill's shape)

    def record(self, n: int, seconds: float) -> None:
        prev, self.last = self.last, n
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
                else:  # the first: take it out of the sizes timed only after another size
                    self.rebuild, sizes, self._switched_only = r, self._switched_only, None
                    for size in sizes:
                        self.measured[size] = max(self.measured[size] - r, 0.5)
                    if sizes:
                        self._fit()
        elif self._one:
            pending = self._switched_only
            if n == prev:
                self._batch(n, seconds / self._one)
                if pending is not None:
                    pending.discard(n)
            else:
                self._batch(n, seconds / self._one - self.rebuild)
                if pending is not None and n not in self._reused:
                    pending.add(n)
            if n == prev:
                self._reused.add(n)

    def _batch(self, n: int, relative: float) -> None:
        r = min(max(relative, 0.5), 1.0 + MAX_SLOPE_SAMPLE * (n - 1))
        old = self.measured.get(n)
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
        pts = {
            n: min(r, 1.0 + self.prior * (n - 1)) if n in self._single else r
            for n, r in self.measured.items()
        }
        self._priced = pts
        self._top = max(pts)
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

    def relative(self, n: int) -> float:
        """Cost of a batch of `n` over a one-token step, its graph reused."""
        if n <= 1:
            return 1.0
        top = self._top
        if not top:
            return 1.0 + self.prior * (n - 1)
        if n >= top:
            return self._priced[top]
        a, b = self._line
        return max(a + b * n, 1.0)

    def call_cost(self, n: int, prev: int) -> float:
        """Cost of a verify batch of `n` right after a call of `prev` tokens, in one-token
        steps: its own, a new graph unless `prev` was the same size, and, when it leaves plain
        steps (`prev` 1, or 0 at a turn's start), the new graph of the plain step that will
        follow the verify run, which staying plain would not pay. Until a batch size has been
        timed the prior alone prices it: with both new graphs priced in, a CPU's prior kept a
        GPU turn from ever timing a batch (simulated with the H200's costs: a copy at 95%
        acceptance went from 1.5x to 1.1x)."""
        cost = self.relative(n)
        if not self.measured:  # nothing timed yet: the prior alone, so batches get timed
            return cost
        if n != prev:
            cost += self.rebuild
        if prev <= 1:
            cost += self.rebuild
        return cost


class Acceptance:
    """Per match-length bucket: the probability that the next drafted token is accepted, given
    the ones before it were (successes over trials, decayed so it follows the text)."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        # prior: two trials; long matches start optimistic, short ones doubtful
        self._stats = {
            b: [2.0 * (0.3 + 0.6 * i / (len(MATCH_BUCKETS) - 1)), 2.0] for i, b in enumerate(MATCH_BUCKETS)
        }

    @staticmethod
    def bucket(length: int) -> int:
        b = MATCH_BUCKETS[0]
        for lo in MATCH_BUCKETS:
            if length >= lo:
                b = lo
        return b

    def rate(self, length: int) -> float:
        s, n = self._stats[self.bucket(length)]
        return s / n

    def update(self, length: int, drafted: int, accepted: int) -> None:
        st = self._stats[self.bucket(length)]
        trials = accepted + (1 if accepted < drafted else 0)
        st[0] = st[0] * self.decay + accepted
        st[1] = st[1] * self.decay + trials


def best_draft_length(
    a: float, k_max: int, cost: CostModel, gain: float, *, available: int | None = None, prev: int = 1
) -> int:
    """The draft length with the most expected tokens per unit of time, or 0 when no length
    beats a plain step by the factor `gain`. Verifying k drafts yields 1 + a + ... + a^k tokens
    (the pending token's successor always, each draft only if all before it were accepted),
    for `cost.call_cost(k + 1, prev)`. Past the `available` draft tokens a batch is padded: no
    more tokens, but the size of the previous verify batch (`prev`) reuses its graph, which on
    a GPU costs less than a smaller batch built anew."""
    best_k, best = 0, 1.0 * gain
    expected = 1.0
    p = 1.0
    real = k_max if available is None else min(available, k_max)
    for k in range(1, k_max + 1):
        if k <= real:
            p *= a
            expected += p
        elif k + 1 != prev or prev not in cost.measured:
            continue  # padding pays only to keep the previous batch's size, timed
        value = expected / cost.call_cost(k + 1, prev)
        if value > best:
            best_k, best = k, value
    return best_k


class SpecStepper:
    """Decodes a reply's pending token, speculatively when a draft is worth it.

    `step(token, room)` puts the sampled `token` (already shown) into the context and returns
    the next sampled tokens in order: one without a draft, 1 + accepted with one. Once settled,
    the context holds everything before the last returned token, which is pending (as after a
    plain step). `settle(stop)` says at which returned token the turn stopped (an
    end-of-generation token, a cancel or a limit): the context is cut back to just before it,
    with the rejected drafts, in the one rollback a hybrid model allows per batch."""

    def __init__(
        self, live: LiveSequence, sampler: Sampler, settings: SpeculationSettings, session: Sequence[int]
    ) -> None:
        self.live = live
        self.sampler = sampler
        self.settings = settings
        self.k_max = min(settings.max_draft, live.max_draft)
        self.index = NgramIndex(settings.min_match)
        self.index.extend(session)
        self.cost = CostModel(slope=settings.batch_cost_prior)
        self.acceptance = Acceptance()
        self.counters = SpecCounters()
        self._rejected = 0  # rejected drafts of the last verify batch, still in the context
        self._returned = 1  # tokens the last step returned
        self._skip = 0  # plain steps left before drafting is tried again (back-off)
        self._backoff = 1

    def _plain(self, token: int) -> list[int]:
        t0 = time.perf_counter()
        self.live.append(token)
        nxt = self.live.sample(self.sampler)
        self.cost.record(1, time.perf_counter() - t0)
        self.counters.decode_calls += 1
        self._returned = 1
        return [nxt]

    def step(self, token: int, room: int) -> list[int]:
        """Decode the pending `token` (the last one `step` returned, or the first of the reply)
        and return the next sampled tokens. `room`: most tokens the turn can still use after
        `token` (its length limit); the context's own end is checked here."""
        self.settle(self._returned - 1)  # the last round's rejected drafts go first
        self.index.add(token)  # decoded in this step, with or without a draft
        k_cap = min(self.k_max, room - 1, self.live.n_ctx - len(self.live) - 2)
        if k_cap <= 0:
            return self._plain(token)
        draft, length = self.index.draft(k_cap)
        k = 0
        if draft and self._skip == 0:
            gain = 1.0 + self.settings.min_gain
            k = best_draft_length(
                self.acceptance.rate(length),
                k_cap,
                self.cost,
                gain,
                available=len(draft),
                prev=self.cost.last,
            )
        if k == 0:
            self._skip = max(self._skip - 1, 0)
            plain = self._plain(token)
            if draft:  # not drafted, but was the draft right? (learns when copying starts)
                self.acceptance.update(length, 1, int(plain[0] == draft[0]))
            return plain
        draft = draft[:k]
        d = len(draft)  # the real draft; the rest of the batch pads it to the last batch's size
        t0 = time.perf_counter()
        self.live.verify([token, *draft, *[draft[-1]] * (k - d)])
        out: list[int] = []
        for i in range(d + 1):
            y = self.live.pick(self.sampler, i)
            out.append(y)
            if i == d or y != draft[i]:
                break
        accepted = len(out) - 1
        self.cost.record(k + 1, time.perf_counter() - t0)
        c = self.counters
        c.drafted += d
        c.accepted += accepted
        c.padded += k - d
        c.rounds += 1
        c.decode_calls += 1
        self.acceptance.update(length, d, accepted)
        if accepted == 0:  # back off: a few plain steps, more after each miss in a row
            self._skip, self._backoff = self._backoff, min(self._backoff * 2, 64)
        else:
            self._backoff = 1
        self.index.extend(draft[:accepted])
        self._returned, self._rejected = len(out), k - accepted
        return out

    def held_before(self, i: int) -> int:
        """Tokens the context holds, once settled, while the `i`-th token the last `step`
        returned is pending."""
        return len(self.live) - self._rejected - (self._returned - 1 - i)

    def settle(self, stop: int) -> None:
        """The turn stopped at the `stop`-th token the last `step` returned (0-based; that
        token stays pending, undecoded): cut the context back to the token before it, together
        with the round's rejected drafts, in the one rollback a hybrid model allows per batch."""
        unused = self._returned - 1 - stop
        drop = self._rejected + unused
        if drop > 0:
            self.live.rollback(drop)
            if unused:
                self.index.truncate(len(self.index) - unused)
        self._returned, self._rejected = stop + 1, 0
