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
  weight types of `EXACT_CPU_WEIGHTS` they are bit-identical; where a backend computes a
  batch with other kernels (a GPU, other weight types) or another algorithm (the
  hybrid models' chunked recurrence) they differ, and greedy output is then identical only up
  to the first token where the two best logits are closer than that. So the engine speculates
  there only when the profile accepts that (`allow_batch_rounding`; `exactness` and
  `speculation_mode` below decide, the load message says which; docs/speculation.md).

Cost control: drafting only pays where a batch of n tokens costs less than n one-token steps
times the tokens it is expected to yield. The stepper keeps the measured time of each batch size,
what a new graph costs when the batch size changes (on a GPU the largest cost; with every
layer on a GPU these are kept from turn to turn: `turn_costs`), and an acceptance estimate per
match length, drafts the length with the best expected tokens per unit
of time (padding a short draft to the last batch's size where that graph is cheaper to reuse),
and does not draft at all when none beats a plain step (novel text). Whatever the cost model
gets wrong, a guard books each verify batch against plain decoding and stops drafting for the
turn once the batches have lost a few steps net (`GUARD_STEPS`), until a run of drafts that
would have been right says a copy has begun.

What `velo-chat bench --spec` measures with it (verify-batch costs, the replay of a reply,
batch against one-token logits) is in `measure.py`.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from ..config.profile_schema import SpeculationSettings
from ..llama.gguf_file import GGML_TYPE_NAMES, GGUFHeader
from ..live_sequence import LiveSequence
from ..llama.sampling import Sampler
from .cost import Acceptance, CostModel, best_draft_length
from .draft import NgramIndex

CUDA_OFFLOAD_BATCH = 32
"""ggml's CUDA backend computes a batch of this many tokens or more on the GPU even for layers
whose weights stay in host memory (it copies them over), so on a CUDA build a verify batch
that large is a GPU batch whatever `n_gpu_layers` says."""


EXACT_CPU_WEIGHTS = frozenset({2, 3, 6, 7, 8})
"""ggml weight types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) whose verify-batch logits were the one-token
steps' to the bit on the CPU backend: SmolLM2 requantized to each type, `tests/test_speculation.py`'s
measurement, on x86_64 with the x86-64-v3 build (packaging/README.md). Measured to differ there:
F32, F16, BF16 (up to 0.03-0.58: tinyBLAS sums a batch in another order than the one-row dot
product) and the K-quants and IQ4 types (up to 0.8-3.1, argmax changes with Q3_K-Q5_K: their
batches take the repacked GEMM kernels). docs/speculation.md has the table."""

X86_64 = ("x86_64", "AMD64")


def batch_weight_types(headers: Sequence[GGUFHeader]) -> frozenset[int]:
    """The ggml types of the weights a batch multiplies, over every shard's header
    (`gguf_file.shard_headers`: a split model's first shard may hold none of them): every tensor
    of two or more dimensions, the token embeddings only where the model has no output matrix
    of its own (tied: they are the output matrix; otherwise only rows are read from them, the
    same way for any batch)."""
    tensors = [t for h in headers for t in h.tensors]
    tied = all(t.name != "output.weight" for t in tensors)
    return frozenset(
        t.ggml_type
        for t in tensors
        if len([d for d in t.shape if d > 1]) >= 2 and (tied or t.name != "token_embd.weight")
    )


def weight_rounding(weight_types: Iterable[int]) -> str:
    """Why an x86_64 CPU rounds a verify batch of these weights otherwise than one token, in
    words naming the types outside `EXACT_CPU_WEIGHTS`; "" where there are none."""
    odd = sorted(set(weight_types) - EXACT_CPU_WEIGHTS)
    if not odd:
        return ""
    names = ", ".join(GGML_TYPE_NAMES.get(t, f"type {t}") for t in odd)
    return (
        f"the CPU multiplies a batch of {names} weights with other kernels than one token, "
        "which a Q8_0 copy (velo-chat requantize) avoids"
    )


def exactness(
    *,
    gpu_build: bool,
    gpu_layers: bool,
    hybrid: bool,
    max_draft: int,
    weight_types: Iterable[int],
    decode_threads: int = 1,
    flash_attn: bool = True,
    machine: str | None = None,
) -> str:
    """Why a verify batch's logits may differ from one-token steps' on this setup, in words;
    "" where they are bit-identical: every layer on the CPU backend of an x86_64 build, weights
    of the types in `EXACT_CPU_WEIGHTS` only (`weight_types`: `batch_weight_types`), an attention
    model, flash attention, and one-token steps on one thread. `machine`: the CPU architecture
    (`platform.machine()`; another CPU's kernels are not checked, so not promised). With decode
    on several threads, one token's attention past 256 tokens of context is split between the
    threads and summed otherwise than a batch's; without flash attention a batch's attention
    takes another path too (`test_bit_identical_needs_one_decode_thread_and_flash_attention`;
    docs/results/speculation.md)."""
    why = []
    if gpu_layers:
        why.append("layers on a GPU, which computes a batch with other kernels than one token")
    elif gpu_build and max_draft + 1 >= CUDA_OFFLOAD_BATCH:
        why.append(f"a GPU build computes batches of {CUDA_OFFLOAD_BATCH}+ tokens on the GPU")
    if hybrid:
        why.append("a hybrid model's recurrence takes its chunked path for a batch")
    if not gpu_layers:
        arch = machine or platform.machine()
        if arch not in X86_64:
            why.append(f"the CPU's batch kernels on {arch} are not measured against one-token steps")
        elif weights := weight_rounding(weight_types):
            why.append(weights)
        if not flash_attn:
            why.append("attention without flash attention sums a batch otherwise than one token")
        if decode_threads > 1:
            why.append(
                f"decode on {decode_threads} threads splits one token's attention otherwise than "
                "a batch's (n_threads = 1 keeps them alike)"
            )
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


def mode_if_enabled(settings: SpeculationSettings, rounding: str, *, needs_reload: bool) -> str:
    """`speculation_mode`'s words with `enabled` switched on: what a profile that enables
    speculation gets on this setup (`bench --spec` says it above its "on" column).
    `needs_reload`: the context was made without what speculation needs (a hybrid model's
    recurrent-state snapshots), so switching it on takes effect only at the next load."""
    could, words = speculation_mode(replace(settings, enabled=True), rounding)
    if could and needs_reload:
        return (
            "off: this hybrid model's context was made without recurrent-state snapshots "
            "(speculation.enabled takes effect at the next load)"
        )
    return words


def turn_costs(live: LiveSequence, settings: SpeculationSettings) -> CostModel:
    """The cost model a turn starts from: the context's, carried (`CostModel.begin_turn`),
    where `keep_costs` says so ("auto": every layer on the GPU); otherwise a new one, with
    only what a stale graph costs kept (the plain steps time that again every 256 tokens)."""
    kept = live.spec_costs
    keep = settings.keep_costs == "on" or (settings.keep_costs == "auto" and live.gpu_resident)
    if kept is not None and keep:
        kept.begin_turn(settings.batch_cost_prior)
        return kept
    return CostModel(slope=settings.batch_cost_prior, stale=kept.stale if kept else None)


GUARD_STEPS = 3.0
"""How many one-token steps a turn's verify batches may lose against plain decoding, net,
before drafting stops (`SpecStepper`): the cost model prices a draft from what it has timed,
and a turn's first batches are priced from the prior; on a GPU a handful of them, each
building new graphs into the batch and back, can cost novel text a visible share of a short
reply."""

GUARD_STREAK = 4
"""Once stopped, drafting starts again after this many plain steps in a row at which the
draft not taken would have been right (a copy has begun); twice as many after each further
stop in the turn, up to `MAX_GUARD_STREAK` (text that repeats only in short runs, where a few
right guesses in a row are not a copy, stops asking)."""

MAX_GUARD_STREAK = 32
"""The longest run of right drafts not taken that a stopped turn waits for."""

EXPLORE_STREAK = 12
"""A run of this many plain steps in a row whose draft, declined by the cost model, would have
been right makes the stepper verify the draft anyway while its costs are an earlier turn's
(`CostModel.carried`): a cost timed too high once is otherwise never timed again, since nothing
is verified while it prices every draft out. A copy meets such a run within a few lines; novel
text seldom does (short runs are common there, and the drafts after them wrong).
After a try whose draft was not accepted whole the stepper waits twice as long, up to
`MAX_EXPLORE_STREAK`."""

MAX_EXPLORE_STREAK = 64
"""The longest run of right drafts declined that a turn waits for before such a try."""


@dataclass
class SpecCounters:
    """A turn's speculation numbers (TurnStats carries them)."""

    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # of those, accepted
    rounds: int = 0  # verify batches
    padded: int = 0  # tokens added to verify batches only to keep the previous batch's size
    decode_calls: int = 0  # llama_decode calls of the decode phase (verify batches included)
    declined: int = 0  # plain steps at which a draft was there but not verified
    guarded: int = 0  # times drafting stopped because the turn's verify batches lost time
    batches: dict[int, int] = field(default_factory=dict)  # verify batch size -> batches
    # what the timed verify batches cost in the turn, in one-token steps (the turn's plain
    # step): size -> (sum, batches); a context's first batch of a size is not timed
    batch_steps: dict[int, tuple[float, int]] = field(default_factory=dict)
    after_verify_steps: tuple[float, int] = (0.0, 0)  # the plain steps right after a verify

    def mean_batch_steps(self) -> dict[int, float]:
        """Each timed verify size's mean cost in one-token steps."""
        return {n: total / count for n, (total, count) in sorted(self.batch_steps.items())}

    def mean_after_verify_steps(self) -> float:
        total, count = self.after_verify_steps
        return total / count if count else 0.0


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
        self.cost = live.spec_costs = turn_costs(live, settings)
        self.acceptance = Acceptance()
        self.counters = SpecCounters()
        self._rejected = 0  # rejected drafts of the last verify batch, still in the context
        self._returned = 1  # tokens the last step returned
        self._skip = 0  # plain steps left before drafting is tried again (back-off)
        self._backoff = 1
        self._balance = 0.0  # one-token steps the verify batches gained (+) or lost (-), net
        self._guarded = False  # drafting stopped: the verify batches lost `GUARD_STEPS`
        self._right = 0  # plain steps in a row whose draft, not taken, would have been right
        self._streak = GUARD_STREAK  # such steps that lift a stop
        self._explore = EXPLORE_STREAK  # such steps, declined, that make a draft verified anyway
        self.clock = time.perf_counter  # what times the steps (a test's virtual clock)

    def _plain(self, token: int) -> list[int]:
        after_verify = self.cost.last > 1
        stale = self.live.graph_stale(1)
        t0 = self.clock()
        self.live.append(token)
        nxt = self.live.sample(self.sampler)
        seconds = self.clock() - t0
        step = self.cost.step_seconds
        self.cost.record(1, seconds, stale)
        if after_verify and step:  # the one-token graph built anew: the verify run's cost
            self._account(1.0 - seconds / step)
            total, count = self.counters.after_verify_steps
            self.counters.after_verify_steps = (total + seconds / step, count + 1)
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
        k, explore = 0, False
        if draft and self._skip == 0 and (not self._guarded or self._right >= self._streak):
            gain = 1.0 + self.settings.min_gain
            k = best_draft_length(
                self.acceptance.rate(length),
                k_cap,
                self.cost,
                gain,
                then=self.acceptance.continuation(length),
                available=len(draft),
                prev=self.cost.last,
                stale=self.live.graph_stale,
            )
            if k == 0 and self._right >= self._explore and self.cost.carried:
                # declined at costs an earlier turn timed, after a run of right drafts: verify
                # it anyway, so that they are timed again (`EXPLORE_STREAK`)
                k, explore = min(len(draft), k_cap), True
        if k == 0:
            self._skip = max(self._skip - 1, 0)
            plain = self._plain(token)
            if draft:  # not drafted, but was the draft right? (learns when copying starts)
                right = plain[0] == draft[0]
                self.acceptance.update(length, 1, int(right))
                self._right = self._right + 1 if right else 0
                self.counters.declined += 1
            else:
                self._right = 0
            return plain
        full, draft = draft, draft[:k]
        d = len(draft)  # the real draft; the rest of the batch pads it to the last batch's size
        first = k + 1 not in self.live.verified_sizes  # the context's first batch of this size
        stale = self.live.graph_stale(k + 1)
        t0 = self.clock()
        self.live.verify([token, *draft, *[draft[-1]] * (k - d)])
        out: list[int] = []
        for i in range(d + 1):
            y = self.live.pick(self.sampler, i)
            out.append(y)
            if i == d or y != draft[i]:
                break
        accepted = len(out) - 1
        seconds = self.clock() - t0
        step = self.cost.step_seconds
        spent = seconds / step if step else 0.0  # in one-token steps
        if first:  # not timed: the next batch of this size says what it costs; the guard
            # books it at no more than the price it was drafted at
            spent = min(spent, self.cost.call_cost(k + 1, self.cost.last, stale))
            self.cost.last = k + 1
        else:
            self.cost.record(k + 1, seconds, stale)
            if step:
                total, count = self.counters.batch_steps.get(k + 1, (0.0, 0))
                self.counters.batch_steps[k + 1] = (total + spent, count + 1)
        self._guarded = self._guarded and accepted < d  # a right draft lifts a stop ...
        self._right = 0
        if step:  # ... unless its batch, too, lost time
            self._account(len(out) - spent)
        c = self.counters
        c.batches[k + 1] = c.batches.get(k + 1, 0) + 1
        c.drafted += d
        c.accepted += accepted
        c.padded += k - d
        c.rounds += 1
        c.decode_calls += 1
        # with every draft accepted, the token sampled after them tests the index's next
        # drafted token as a longer draft would have (a copy drafting batches of 2 learns its
        # continuation so, and longer drafts follow)
        longer = accepted == d < len(full)
        self.acceptance.update(length, d + longer, accepted + (longer and out[d] == full[d]))
        if explore and accepted < d:
            self._explore = min(self._explore * 2, MAX_EXPLORE_STREAK)
        if accepted == 0:  # back off: a few plain steps, more after each miss in a row
            self._skip, self._backoff = self._backoff, min(self._backoff * 2, 64)
        else:
            self._backoff = 1
        self.index.extend(draft[:accepted])
        self._returned, self._rejected = len(out), k - accepted
        return out

    def _account(self, steps: float) -> None:
        """Book what a verify batch, or the plain step its new graph slowed, gained against
        plain decoding, in one-token steps; stop drafting when the turn's batches have lost
        `GUARD_STEPS` net (the drafts not taken still teach the acceptance, and a run of
        right ones, `GUARD_STREAK` at first, starts drafting again). The balance keeps at most
        `GUARD_STEPS` of gain, so a copy earlier in the turn does not pay for drafts that lose
        later."""
        self._balance = min(self._balance + steps, GUARD_STEPS)
        if self._balance < -GUARD_STEPS and not self._guarded:
            self._guarded, self._balance = True, 0.0
            if self.counters.guarded:
                self._streak = min(self._streak * 2, MAX_GUARD_STREAK)
            self.counters.guarded += 1

    def force(self, token: int) -> None:
        """Decode a token the turn chose rather than sampled (the thinking budget's closing,
        after `settle`) as a plain step, untimed; it joins the draft source like every decoded
        token, and the next `step` starts from it with nothing pending."""
        self.live.append(token)
        self.index.add(token)
        self.counters.decode_calls += 1
        self.cost.last = 1
        self._returned, self._rejected = 1, 0

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
