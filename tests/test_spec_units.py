"""Speculation's parts without a model: the draft source (`NgramIndex`, speculation/draft.py),
the cost model and the draft length (speculation/cost.py), the exactness rule (`exactness`,
speculation/stepper.py), and the speculative-sampling rule as llama.cpp's sampler chain draws
it. The engine-level tests on real models are in `test_speculation.py`."""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from velo_chat.engine.speculation import cost as spec_cost, stepper as speculation
from velo_chat.engine.speculation.cost import CostModel
from velo_chat.engine.speculation.draft import NgramIndex


def test_ngram_index_finds_the_longest_recent_match() -> None:
    index = NgramIndex(2)
    assert index.sizes == (2, 4, 6, 8)
    index.extend([1, 2, 3, 4, 5, 9, 9, 2, 3, 4, 6, 7])
    index.extend([0, 2, 3, 4])
    draft, length = index.draft(3)
    assert draft == [6, 7, 0] and length == 3  # the latest "2 3 4", not the first
    index.extend([1, 2, 3, 4])
    draft, length = index.draft(2)
    assert length == 4 and draft == [5, 9]  # "1 2 3 4" beats the later "2 3 4"
    index.add(77)
    assert index.draft(4) == ([], 0)
    index.truncate(3)
    assert index.tokens == [1, 2, 3] and index.draft(2) == ([], 0)  # nothing points past the end


def test_ngram_index_shortcut_drafts_what_every_size_would() -> None:
    """`draft` gives up after one lookup when the shortest n-gram ending the sequence never
    occurred (every size is recorded together, so no longer one did either): the same drafts
    as looking every size up, over streams with many repeats, truncations included."""
    rng = random.Random(7)
    for min_n in (2, 3, 5):
        index = NgramIndex(min_n)
        found = 0
        for step in range(4000):
            index.add(rng.randrange(3) if step % 500 < 250 else rng.randrange(5000))
            if step % 97 == 96:
                index.truncate(len(index) - rng.randrange(1, 12))
            got = index.draft(8)
            assert got == index.lookup(8)
            found += bool(got[0])
        assert 1000 < found < 3000  # both kinds of step were exercised


def test_draft_length_follows_acceptance_and_cost() -> None:
    cpu = CostModel(slope=0.6)
    assert spec_cost.best_draft_length(0.3, 16, cpu, 1.05) == 0  # novel text: no draft
    assert spec_cost.best_draft_length(0.99, 16, cpu, 1.05) >= 8
    gpu = CostModel(slope=0.02)
    assert spec_cost.best_draft_length(0.5, 16, gpu, 1.05) >= 2
    for _ in range(40):  # measured: a batch of 5 as cheap as one token
        cpu.record(1, 0.010)
        cpu.record(5, 0.010)
    assert cpu.relative(9) == pytest.approx(1.0, abs=0.01)  # and so every size


def test_acceptance_learns_a_drafts_first_token_apart_from_what_follows() -> None:
    """A declined draft tests only its first token, a verify batch the tokens after it too.
    Novel code (on an H200: first tokens right at 0.85, batches of 16 drafts accepted 3 at a
    time) keeps a high first-token rate and a low continuation, and the draft length priced
    with both takes a short draft or none where one pooled rate took the longest; a copy
    (batches accepted whole) keeps both high and drafts the longest."""
    gpu = CostModel(slope=0.8)
    prev = 0
    for n in (1, 1, 1, 17, 17, 1, 1, 5, 5, 1, 1):  # SmolLM2 on an H200, a graph per shape
        gpu.record(n, 0.001 * (H200_PER_SHAPE[n] + (0.69 if n != prev else 0.0)))
        prev = n
    assert gpu.rebuild == pytest.approx(0.69, abs=0.01)
    novel = spec_cost.Acceptance()
    before = novel.continuation(20)
    for i in range(40):  # declined drafts, 6 of 7 right: the continuation is not touched
        novel.update(20, 1, int(i % 7 != 3))
    assert novel.rate(20) > 0.8 and novel.continuation(20) == before
    for _ in range(4):  # verify batches: 3 of 16 accepted
        novel.update(20, 16, 3)
    first, then = novel.rate(20), novel.continuation(20)
    assert first > 0.85 and then == pytest.approx(2 / 3, abs=0.03)
    assert spec_cost.best_draft_length(first, 16, gpu, 1.05, prev=1) >= 8  # one rate for both
    assert spec_cost.best_draft_length(first, 16, gpu, 1.05, then=then, prev=1) < 8
    copy = spec_cost.Acceptance()
    for _ in range(4):
        copy.update(20, 16, 16)
    assert copy.rate(20) > 0.9 and copy.continuation(20) > 0.95
    assert spec_cost.best_draft_length(copy.rate(20), 16, gpu, 1.05, then=copy.continuation(20), prev=1) == 16
    copy.update(20, 16, 0)  # a batch rejected at its first token says nothing of the rest
    assert copy.continuation(20) > 0.95 and copy.rate(20) < 0.9


def test_cost_model_believes_no_single_slow_batch_and_caps_outliers() -> None:
    cost = CostModel(slope=0.5)
    cost.record(1, 0.001)
    cost.record(1, 0.001)
    cost.record(5, 0.050)  # the first batch of five tokens (an allocation, or descheduled)
    assert cost.relative(5) == 3.0  # timed once: no dearer than the prior
    cost.record(5, 0.0015)
    assert cost.relative(5) == pytest.approx(1.5)  # the lower of the first two
    slow = CostModel(slope=0.5)
    for n in (1, 1, 5, 5):
        slow.record(n, 0.050 if n == 5 else 0.001)  # twice: believed, capped
    assert slow.measured[5] == pytest.approx(1.0 + 4 * spec_cost.MAX_SLOPE_SAMPLE)
    for _ in range(30):
        slow.record(5, 0.0015)
    assert slow.relative(5) == pytest.approx(1.5, abs=0.02)  # it follows the measured cost
    assert slow.relative(3) == pytest.approx(1.25, abs=0.02)  # below: the line through the step


def test_cost_model_fits_the_batches_not_the_one_token_step() -> None:
    """A batch of two costs about two steps on SmolLM2's CPU path, one of 17 about 10.7: one
    slope through the one-token step learnt at the short drafts would never draft again, while
    17 tokens for 10.7 steps is a 1.6x gain at full acceptance."""
    cost = CostModel(slope=0.8)
    for _ in range(3):
        cost.record(1, 0.010)
        cost.record(2, 0.0206)
    assert cost.relative(2) == pytest.approx(2.06)
    # beyond the largest size measured it is optimistic, so a high acceptance tries a long draft
    assert spec_cost.best_draft_length(0.95, 16, cost, 1.05) == 16
    assert spec_cost.best_draft_length(0.3, 16, cost, 1.05) == 0  # novel text still does not
    for _ in range(3):
        cost.record(17, 0.107)
    assert cost.relative(17) == pytest.approx(10.7)
    assert cost.relative(9) == pytest.approx(2.06 + 7 * (10.7 - 2.06) / 15)  # on the line
    assert spec_cost.best_draft_length(1.0, 16, cost, 1.05) == 16
    assert spec_cost.best_draft_length(0.6, 16, cost, 1.05) == 0


H200_SAME = {1: 1.0, 2: 1.14, 5: 1.43, 9: 2.98, 17: 3.59}
"""SmolLM2 with every layer on an H200: a verify of n tokens after one of its size (graph
reused), in one-token steps (device_spec.sh, 2026-12-01)."""
H200_NEW = {1: 3.70, 2: 4.40, 5: 4.34, 9: 5.95, 17: 5.80}
"""The same, each after a call of another size (a new graph)."""


def _h200(cost: CostModel, n: int, prev: int) -> None:
    cost.record(n, 0.001 * (H200_SAME if n == prev else H200_NEW)[n])


def test_cost_model_prices_a_new_graph() -> None:
    """On the H200 a verify after a plain step, and the plain step after it, each build a new
    graph (3-4 steps): the stepper times that from the step after a verify and charges it to
    a draft that leaves plain steps, so novel text (acceptance about 0.3) stops drafting while
    a copy (acceptance near 1) drafts the longest batch, and back to back batches keep their
    size (padding a short draft) rather than build another graph."""
    cost = CostModel(slope=0.8)
    prev = 0
    for n in (1, 1, 1, 2, 2, 1, 1, 17, 17, 17, 1, 1, 5, 5, 1, 1, 9, 9, 1):
        _h200(cost, n, prev)
        prev = n
    assert cost.rebuild == pytest.approx(2.7, abs=0.05)
    assert 3.0 < cost.relative(17) < 3.7  # the lower of its first two timings, then 3.59s
    assert cost.relative(2) == pytest.approx(1.14, abs=0.3)
    assert cost.call_cost(17, 1) == pytest.approx(cost.relative(17) + 2 * cost.rebuild)
    assert cost.call_cost(17, 17) == cost.relative(17)
    assert spec_cost.best_draft_length(0.3, 16, cost, 1.05, prev=1) == 0  # novel
    assert spec_cost.best_draft_length(0.7, 16, cost, 1.05, prev=1) == 0
    assert spec_cost.best_draft_length(0.99, 16, cost, 1.05, prev=1) == 16  # a copy
    # inside a run of 17-token batches a 4-token draft is padded to 17 (3.6 steps, not 1.4 + 2.7)
    assert spec_cost.best_draft_length(0.99, 16, cost, 1.05, available=4, prev=17) == 16
    assert spec_cost.best_draft_length(0.99, 16, cost, 1.05, available=4, prev=1) == 0
    # on a CPU a new graph is cheap: the same draft is not padded
    cpu = CostModel(slope=0.8)
    for n, ms in ((1, 19.3), (1, 19.3), (2, 40.0), (2, 39.8), (1, 19.5), (5, 87.0), (5, 87.0), (1, 19.4)):
        cpu.record(n, ms / 1000)
    assert cpu.rebuild < 0.05
    assert spec_cost.best_draft_length(0.99, 16, cpu, 1.05, available=4, prev=17) == 4


def _searched(a, then, k_max, cost, gain, available, prev, stale):
    """`best_draft_length` without its bound: every length priced (the reference)."""
    best_k, best, expected = 0, gain, 1.0
    real = min(available, k_max)
    for k in range(1, k_max + 1):
        if k <= real:
            expected += a * then ** (k - 1)
        elif k + 1 != prev or prev not in cost.measured:
            continue
        value = expected / cost.call_cost(k + 1, prev, stale(k + 1))
        if value > best:
            best_k, best = k, value
    return best_k


def test_draft_length_bound_declines_only_what_no_length_would_take() -> None:
    """The bound `best_draft_length` checks first (the most tokens any draft yields over the
    cheapest call) gives the answer of pricing every length, over cost models timed from random
    batches on a CPU-like and a GPU-like backend, every acceptance and previous call; and it
    does decline novel text on the GPU-like one, where it is meant to save the search."""
    rng = random.Random(7)
    bounded = 0
    for case in range(300):
        gpu = case % 2 == 1
        cost = CostModel(slope=rng.choice((0.05, 0.5, 0.8)), stale=rng.choice((None, 3.0)))
        prev = 1
        for _ in range(rng.randrange(0, 30)):
            n = rng.choice((1, 1, 1, 2, 3, 5, 9, 17))
            rebuild = (3.0 if gpu else 0.05) if n != prev else 0.0
            per = (0.15 if gpu else 0.9) * (n - 1)
            cost.record(n, 0.001 * (1.0 + per + rebuild) * rng.uniform(0.9, 1.2), rng.random() < 0.1)
            prev = n
        stale_sizes = {n for n in range(2, 18) if rng.random() < 0.3}
        for a in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0):
            for prev in (0, 1, 2, 9, 17):
                available = rng.randrange(1, 17)
                then = rng.choice((None, 0.0, 0.3, 0.7, 0.95, 1.0))
                t = a if then is None else then
                want = _searched(a, t, 16, cost, 1.05, available, prev, stale_sizes.__contains__)
                got = spec_cost.best_draft_length(
                    a,
                    16,
                    cost,
                    1.05,
                    then=then,
                    available=available,
                    prev=prev,
                    stale=stale_sizes.__contains__,
                )
                assert got == want, (case, a, then, prev, available)
                most = 1.0 + sum(a * t**i for i in range(available))
                bounded += gpu and most <= 1.05 * cost.floor(prev)
    assert bounded > 100


H200_PER_SHAPE = {1: 1.0, 2: 1.127, 3: 1.173, 5: 1.275, 9: 2.798, 17: 3.139}
"""SmolLM2 on an H200 with a CUDA graph per batch shape, back to back (2026-12-02)."""


def test_cost_model_finds_a_step() -> None:
    """A verify of 8 tokens on the H200 is still the matrix-vector kernel's, of 9 the
    matrix-matrix one's: between timed sizes on either side interpolation prices 8 far too high
    and it would never be tried. The powers of two inside such a stretch are priced from its
    lower end and its neighbours' slope instead, so the draft length rule tries them, largest
    value first, until the largest cheap size is known. Both ways a turn may have timed the
    sizes around the step (an H200 copy-edit of 2026-12-02 timed 2, 9 and 17 first)."""
    true = {n: 1.275 + (n - 5) * 0.05 if n < 9 else 2.798 + (n - 9) * 0.0426 for n in range(2, 18)}
    true.update({1: 1.0, 2: 1.127, 3: 1.173, 5: 1.275, 8: 1.426})  # as measured
    for timed, first in (((2, 5, 9, 17), [8]), ((2, 9, 17), [8]), ((2, 5, 17), [16, 8])):
        cost = CostModel(slope=0.8)
        for n in (1, 1, *(m for m in timed for _ in range(2))):
            cost.record(n, 0.001 * true[n])
        assert cost.relative(9 if 9 in timed else 17) == pytest.approx(true[9 if 9 in timed else 17])
        tried = []
        for _ in range(6):
            k = spec_cost.best_draft_length(0.97, 16, cost, 1.05, prev=0)
            tried.append(k + 1)
            for _ in range(2):
                cost.record(k + 1, 0.001 * true[k + 1])
        assert tried[: len(first)] == first and cost.probes == len(first), (timed, tried)
        assert cost.relative(8) == pytest.approx(1.426)
        assert set(tried[len(first) :]) == {8}, (timed, tried)  # 8 for 1.43 steps beats 17 for 3.14


def test_cost_model_probes_nothing_where_the_cost_grows_evenly() -> None:
    """SmolLM2 on this CPU (a batch costs about its tokens): no stretch stands out, and the
    probes a turn may make are capped where one does."""
    cpu = CostModel(slope=0.8)
    for n, r in ((1, 1.0), (1, 1.0), (2, 2.06), (2, 2.06), (3, 2.68), (3, 2.68), (5, 4.51), (5, 4.51)):
        cpu.record(n, 0.01 * r)
    for n, r in ((9, 6.57), (9, 6.57), (17, 10.71), (17, 10.71)):
        cpu.record(n, 0.01 * r)
    assert cpu.relative(8) == pytest.approx(4.51 + 3 * (6.57 - 4.51) / 4) and cpu.probes == 0
    capped = CostModel(slope=0.8)
    capped.probes = spec_cost.MAX_PROBES
    for n in (1, 1, 2, 2, 5, 5, 9, 9, 17, 17):
        capped.record(n, 0.001 * H200_PER_SHAPE[n])
    assert capped.relative(8) == pytest.approx(1.275 + 3 * (2.798 - 1.275) / 4)  # interpolated


def test_cost_model_counts_batches_timed_before_the_first_rebuild() -> None:
    """Batches timed after another size before any plain step followed a verify hold a new
    graph's cost; once a rebuild is timed it is taken out of them."""
    cost = CostModel(slope=0.8)
    prev = 0
    for n in (1, 1, 2, 2, 2, 5, 9, 5):  # no plain step after a verify yet
        _h200(cost, n, prev)
        prev = n
    assert cost.rebuild == 0.0 and cost.measured[5] > 4.0
    for n in (1, 1):
        _h200(cost, n, prev)
        prev = n
    assert cost.rebuild == pytest.approx(2.7, abs=0.05)
    assert cost.measured[5] == pytest.approx(4.34 - 2.7, abs=0.05)  # 5 only ever after another size
    assert cost.measured[2] == pytest.approx(1.14, abs=0.05)  # 2 was timed back to back


def test_exactness_rule() -> None:
    """Bit-identical only with every layer on the CPU backend and an attention model; a CUDA
    build computes batches of 32+ tokens on the GPU whatever the layers; speculation is used
    where it is not bit-identical only when the profile accepts the batch rounding."""
    from velo_chat.engine.config.profile_schema import SpeculationSettings

    q4_1 = {"weight_types": {3, 8}, "machine": "x86_64"}  # SmolLM2: Q4_1 layers, Q8_0 output
    assert speculation.exactness(gpu_build=True, gpu_layers=False, hybrid=False, max_draft=16, **q4_1) == ""
    gpu = speculation.exactness(gpu_build=True, gpu_layers=True, hybrid=False, max_draft=16, **q4_1)
    assert "GPU" in gpu
    assert "32+" in speculation.exactness(
        gpu_build=True, gpu_layers=False, hybrid=False, max_draft=31, **q4_1
    )
    assert speculation.exactness(gpu_build=False, gpu_layers=False, hybrid=False, max_draft=64, **q4_1) == ""
    assert "chunked" in speculation.exactness(
        gpu_build=False, gpu_layers=False, hybrid=True, max_draft=8, **q4_1
    )
    cpu = {"gpu_build": False, "gpu_layers": False, "hybrid": False, "max_draft": 16}
    assert speculation.exactness(**cpu, **q4_1, decode_threads=1, flash_attn=True) == ""
    assert "decode on 2 threads" in speculation.exactness(**cpu, **q4_1, decode_threads=2, flash_attn=True)
    assert "without flash attention" in speculation.exactness(
        **cpu, **q4_1, decode_threads=1, flash_attn=False
    )
    # the weight types: exact only those measured so, and only on the CPUs measured
    for exact in ({2}, {3}, {6}, {7}, {8}, {2, 3, 6, 7, 8}):
        assert speculation.exactness(**cpu, weight_types=exact, machine="AMD64") == ""
    k_quants = speculation.exactness(**cpu, weight_types={12, 14, 8}, machine="x86_64")
    assert "a batch of Q4_K, Q6_K weights" in k_quants and "requantize" in k_quants
    assert "F16, BF16" in speculation.exactness(**cpu, weight_types={30, 1}, machine="x86_64")
    arm = speculation.exactness(**cpu, weight_types={8}, machine="aarch64")
    assert "on aarch64 are not measured" in arm
    assert (
        speculation.exactness(gpu_build=True, gpu_layers=True, hybrid=False, max_draft=16, weight_types={12})
        == gpu
    )
    on = SpeculationSettings(enabled=True)
    assert speculation.speculation_mode(on, "") == (True, "on: bit-identical to plain decoding")
    allowed, why = speculation.speculation_mode(on, "layers on a GPU")
    assert not allowed and why.startswith("off: a verify batch would round") and "allow_batch_rounding" in why
    rounding = SpeculationSettings(enabled=True, allow_batch_rounding=True)
    assert speculation.speculation_mode(rounding, "layers on a GPU") == (
        True,
        "on: plain decoding up to the batch rounding (layers on a GPU)",
    )
    assert speculation.speculation_mode(SpeculationSettings(), "x") == (False, "off")


def test_sampled_acceptance_follows_the_speculative_sampling_rule() -> None:
    """The engine accepts a drafted token x when the turn's sampler chain, drawing from p,
    gives x. On a six-token distribution with a fixed seed: x is accepted with probability
    p(x), and a rejection yields p with x removed, renormalised."""
    from llama_cpp import llama_cpp as ll

    p = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
    n_vocab, draft, trials = len(p), 1, 20000
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_temp(1.0))
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_dist(1234))
    data = (ll.llama_token_data * n_vocab)()
    arr = ll.llama_token_data_array(data, n_vocab, -1, False)
    accepted = 0
    replaced = np.zeros(n_vocab)
    try:
        for _ in range(trials):
            for i in range(n_vocab):
                data[i].id, data[i].logit, data[i].p = i, float(np.log(p[i])), 0.0
            arr.size, arr.selected, arr.sorted = n_vocab, -1, False
            ll.llama_sampler_apply(chain, ctypes.byref(arr))
            y = data[arr.selected].id
            if y == draft:
                accepted += 1
            else:
                replaced[y] += 1
    finally:
        ll.llama_sampler_free(chain)
    sigma = np.sqrt(p[draft] * (1 - p[draft]) / trials)
    assert abs(accepted / trials - p[draft]) < 4 * sigma
    assert replaced[draft] == 0
    rest = np.delete(p, draft) / (1 - p[draft])
    observed = np.delete(replaced, draft)
    expected = rest * observed.sum()
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # 4 degrees of freedom: p < 0.0005
