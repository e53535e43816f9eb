"""`velo-chat bench --spec`: n-gram speculation side by side with plain decoding.

Two workloads built from a real source file (the standard library's `colorsys.py`, 166 lines,
not written for this): **copy-edit** gives the file and asks for it back with one function
renamed (the reply repeats the prompt: drafts should be accepted), **novel** asks for new code
(little to draft from). Each runs greedy with speculation off and on, in the same engine and
context; the replies must be the same text. **replay** decodes the novel prompt's reply again
with that reply in the draft source (the best case on the backend, for any model). The section
also times one verify batch of k tokens against one token (`cost`, each size in a row so its
graph is reused; `cost_alternating`, each after another size): where a batch of k costs about k
steps (a small model on a CPU) no draft can pay much, and `limit` says how much at full and at
the measured acceptance.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

from .. import ChatMessage, EngineAPI, PromptTooLong, SpeculationStats, TokenDelta, TurnDone, TurnStats
from ..diagnostics import Diagnostics, common_prefix, diagnostics
from .spec_source import CopyEditSource, colorsys_source

BATCH_SIZES = (1, 2, 3, 5, 8, 9, 17)  # 8 and 9: either side of CUDA's matrix-vector limit

MIN_SHARED = 32
"""Fewest tokens two replies that part (batch rounding) must share before `bench --spec`
compares their decode rates over them."""


def workloads(source: CopyEditSource | None = None) -> dict[str, list[ChatMessage]]:
    """The copy-edit and novel prompts. `source`: the copy-edit file and rename (default: the
    standard library's colorsys.py, `_v` renamed to `_value`; `bench --spec --spec-file`)."""
    return {
        "copy-edit": [(source or colorsys_source()).message()],
        "novel": [
            ChatMessage(
                "user",
                "Write a new Python module that converts colours between RGB and CMYK, with "
                "docstrings and a small command-line interface.",
            )
        ],
    }


@dataclasses.dataclass(frozen=True)
class TokenTimes:
    """A reply's tokens and when each was sampled (`TokenDelta.t`)."""

    ids: list[int]
    times: list[float]

    def rate_over(self, n: int) -> float:
        """Decode tok/s over the reply's first `n` tokens (as `TurnStats.decode_tok_s`
        counts: the first token's time starts the clock)."""
        span = self.times[n - 1] - self.times[0]
        return (n - 1) / span if n > 1 and span > 0 else 0.0


def timed_reply(
    diag: Diagnostics, messages: list[ChatMessage], max_tokens: int
) -> tuple[TurnDone, TokenTimes]:
    """Run a turn to its end; its `TurnDone` and each token's time."""
    deltas: list[TokenDelta] = []
    done = diag.complete(messages, max_tokens=max_tokens, deltas=deltas)
    return done, TokenTimes([d.token_id for d in deltas], [d.t for d in deltas])


def shared_rates(off: list[TokenTimes], on: list[TokenTimes]) -> dict[str, Any]:
    """Where speculation's replies part from plain decoding's (a GPU's batch rounding), the
    decode rates over the tokens every reply shares, so that the speedup compares the same
    text: whole replies may differ in length and in how much of them is a loop, which drafts
    well. Empty when the replies are identical or share fewer than `MIN_SHARED` tokens."""
    first = off[0].ids
    shared = min(common_prefix(first, r.ids) for r in (*off, *on))
    if all(r.ids == first for r in (*off, *on)) or shared < MIN_SHARED:
        return {}
    rate_off = statistics.median(r.rate_over(shared) for r in off)
    rate_on = statistics.median(r.rate_over(shared) for r in on)
    return {
        "shared_tokens": shared,
        "tok_s_off_shared": round(rate_off, 2),
        "tok_s_on_shared": round(rate_on, 2),
        "speedup_shared": round(rate_on / rate_off, 3) if rate_off else None,
    }


def with_speculation(engine: EngineAPI, enabled: bool) -> None:
    """Apply the engine's profile with speculation switched on or off (a context reload on a
    hybrid model; `benchmarks/spec_trace.py` uses it too)."""
    profile = engine.profile
    spec = dataclasses.replace(profile.speculation, enabled=enabled)
    engine.apply(dataclasses.replace(profile, speculation=spec))


def speedup_limit(costs: dict[int, float], acceptance: float) -> float:
    """Most tokens per one-token step any draft length gives at this acceptance rate (the
    chance that each next drafted token is accepted): max over k of E[tokens] / cost(k + 1)."""
    one = costs[1]
    best = 1.0
    for n, seconds in costs.items():
        k = n - 1
        expected = sum(acceptance**i for i in range(k + 1))
        best = max(best, expected / (seconds / one))
    return best


def copy_edit_budget(
    name: str, prompt_tokens: int, n_ctx: int, decode_tokens: int, copy_tokens: int | None
) -> int:
    """The most tokens copy-edit's reply may take. The reply that prompt asks for is the whole
    file, about as many tokens as the prompt (the file and a line of instructions), and most of
    what speculation gains is in it: a reply cut at a few hundred tokens measures the model's
    opening words, which nothing in the session predicts. So by default (`copy_tokens` None)
    the budget is the prompt's length as far as the context leaves room, and at least
    `decode_tokens`; `copy_tokens` (the user's `--decode-tokens`) sets it outright. Raises
    `PromptTooLong` when the prompt (of the file `name`) and the budget do not fit."""
    room = n_ctx - prompt_tokens
    budget = copy_tokens if copy_tokens is not None else max(min(prompt_tokens, room), decode_tokens)
    if budget > room:
        raise PromptTooLong(
            f"the copy-edit prompt ({name}) is {prompt_tokens:,} tokens and the reply may take "
            f"{budget:,} more: the context holds {n_ctx:,} (a shorter file, fewer "
            "--decode-tokens or a profile with a larger n_ctx)"
        )
    return budget


def spec_section(
    engine: EngineAPI,
    *,
    decode_tokens: int,
    repeats: int,
    note: Callable[[str], None],
    source: CopyEditSource | None = None,
    copy_tokens: int | None = None,
) -> dict[str, Any]:
    """The section's numbers (docs/speculation.md, "Measuring it"). `source`: the copy-edit
    workload's file and rename (default colorsys.py). `decode_tokens`: the novel and replay
    replies' length; copy-edit's is `copy_edit_budget`'s (the whole file unless `copy_tokens`).
    Raises `PromptTooLong` before anything runs when the copy-edit prompt and its reply do not
    fit in the context."""
    diag = diagnostics(engine)
    loaded = engine.profile
    spec = loaded.speculation
    source = source or colorsys_source()
    prompts = workloads(source)
    info = engine.info
    assert info is not None, "load the engine first"
    prompt_tokens = len(diag.tokens_for(prompts["copy-edit"], diag.template_variables()))
    copy_budget = copy_edit_budget(source.name, prompt_tokens, info.n_ctx, decode_tokens, copy_tokens)
    out: dict[str, Any] = {
        "max_draft": spec.max_draft,
        "min_match": spec.min_match,
        # the "on" column's guarantee (bit-identical, up to batch rounding, or off and why),
        # whether or not the loaded profile enables speculation
        "speculation": diag.speculation_if_enabled,
        "copy_edit_source": {
            **source.describe(),
            "prompt_tokens": prompt_tokens,
            "reply_budget": copy_budget,
        },
    }
    try:
        with diag.checkpoints_at(None):
            for name, messages in prompts.items():
                budget = copy_budget if name == "copy-edit" else decode_tokens
                runs, timed = _off_and_on(engine, diag, name, messages, budget, repeats, note)
                out[name] = _workload_row(runs, timed)
            out["replay"] = _replay(diag, decode_tokens, repeats, note)
            costs, cost_rows = _verify_costs(diag, repeats, note)
            out.update(cost_rows)
    finally:
        with_speculation(engine, loaded.speculation.enabled)
    one = costs[1]
    out["cost"] = {str(k): round(v / one, 3) for k, v in costs.items()}
    out["cost_1_ms"] = round(one * 1000, 3)
    copy = out["copy-edit"]
    out["limit_full"] = round(speedup_limit(costs, 1.0), 3)
    out["limit_at_copy_acceptance"] = round(speedup_limit(costs, copy.get("acceptance", 0.0)), 3)
    return out


def _off_and_on(
    engine: EngineAPI,
    diag: Diagnostics,
    name: str,
    messages: list[ChatMessage],
    budget: int,
    repeats: int,
    note: Callable[[str], None],
) -> tuple[dict[bool, list[TurnDone]], dict[bool, list[TokenTimes]]]:
    """One workload `repeats` times with speculation off and on, in turns (both see the same
    machine load): each run's `TurnDone` and token times, by speculation on or off."""
    runs: dict[bool, list[TurnDone]] = {False: [], True: []}
    timed: dict[bool, list[TokenTimes]] = {False: [], True: []}
    for i in range(repeats):
        for enabled in (False, True):
            note(f"speculation: {name}, {'on' if enabled else 'off'} ({i + 1}/{repeats})")
            with_speculation(engine, enabled)
            diag.reset()
            done, times = timed_reply(diag, messages, budget)
            runs[enabled].append(done)
            timed[enabled].append(times)
    return runs, timed


def _spec(stats: TurnStats) -> SpeculationStats:
    """The speculation counters of an in-process turn (the only kind this benchmark runs)."""
    assert stats.speculation is not None, "an in-process turn reports its speculation"
    return stats.speculation


def _graphs_reused(stats: TurnStats) -> int:
    return stats.llama.graphs_reused if stats.llama is not None else 0


def _workload_row(runs: dict[bool, list[TurnDone]], timed: dict[bool, list[TokenTimes]]) -> dict[str, Any]:
    """A workload's row: both columns' rates, and the last speculative run's counters."""
    row: dict[str, Any] = {}
    stats: dict[bool, list[TurnStats]] = {k: [d.stats for d in v] for k, v in runs.items()}
    for enabled, key in ((False, "off"), (True, "on")):
        row[f"tok_s_{key}"] = round(statistics.median(s.decode_tok_s for s in stats[enabled]), 2)
        row[f"tok_s_{key}_runs"] = [round(s.decode_tok_s, 2) for s in stats[enabled]]
    # each speculative run's drafts (the counters below are the last run's): a
    # context's first runs may draft otherwise than the later ones
    row["on_runs"] = [
        {
            "tok_s": round(r.decode_tok_s, 2),
            "drafted": _spec(r).drafted,
            "accepted": _spec(r).accepted,
            "batches": {str(n): c for n, c in sorted(_spec(r).batches.items())},
        }
        for r in stats[True]
    ]
    s = stats[True][-1]
    spec = _spec(s)
    row.update(
        drafted=spec.drafted,
        accepted=spec.accepted,
        acceptance=round(spec.acceptance, 4),
        tokens_per_call=round(s.tokens_per_call, 3),
        declined=spec.declined,
        guarded=spec.guarded,
        batches={str(n): c for n, c in sorted(spec.batches.items())},
        batch_steps={str(n): round(v, 3) for n, v in spec.batch_steps.items()},
        after_verify_steps=round(spec.after_verify_steps, 3),
        decode_tokens=s.decode_tokens,
        speedup=round(row["tok_s_on"] / row["tok_s_off"], 3) if row["tok_s_off"] else None,
        identical=runs[False][-1].text == runs[True][-1].text,
        graphs_reused=_graphs_reused(s),
        graphs_reused_off=_graphs_reused(stats[False][-1]),
        **shared_rates(timed[False], timed[True]),
    )
    return row


def _verify_costs(
    diag: Diagnostics, repeats: int, note: Callable[[str], None]
) -> tuple[dict[int, float], dict[str, Any]]:
    """The seconds of a verify batch of each size (`BATCH_SIZES`, each size in a row), and the
    rows that set it against other orders and threads: each after another size, and on the
    prefill threads where verify batches run on the decode ones."""
    note("speculation: cost of a verify batch")
    diag.reset()
    novel = workloads()["novel"]
    costs = diag.verify_batch_costs(novel, BATCH_SIZES, max(repeats, 5))
    alternating = diag.verify_batch_costs(novel, BATCH_SIZES, max(repeats, 5), alternate=True)
    rows: dict[str, Any] = {
        "cost_alternating": {str(k): round(v / costs[1], 3) for k, v in alternating.items()},
        "verify_threads": diag.verify_threads,
    }
    threads = diag.threads_now
    if diag.verify_threads == "decode" and threads[0] != threads[1]:
        note("speculation: cost of a verify batch on the prefill threads")
        on_prefill = diag.verify_batch_costs(novel, BATCH_SIZES, max(repeats, 5), prefill_threads=True)
        rows["cost_on_prefill_threads"] = {str(k): round(v / costs[1], 3) for k, v in on_prefill.items()}
    diag.reset()
    return costs, rows


def _replay(
    diag: Diagnostics, decode_tokens: int, repeats: int, note: Callable[[str], None]
) -> dict[str, Any]:
    """The novel prompt's greedy reply decoded plain, then with speculation drafting from that
    reply (`Diagnostics.spec_replay`): the best case this backend allows, on any model."""
    results = []
    for i in range(repeats):
        note(f"speculation: replay ({i + 1}/{repeats})")
        diag.reset()
        results.append(diag.spec_replay(workloads()["novel"], decode_tokens))
    off = [(r.tokens - 1) / r.plain_s for r in results]
    on = [(r.tokens - 1) / r.spec_s for r in results]
    c = results[-1].counters
    return {
        "tok_s_off": round(statistics.median(off), 2),
        "tok_s_off_runs": [round(x, 2) for x in off],
        "tok_s_on": round(statistics.median(on), 2),
        "tok_s_on_runs": [round(x, 2) for x in on],
        "drafted": c.drafted,
        "accepted": c.accepted,
        "acceptance": round(c.accepted / c.drafted, 4) if c.drafted else 0.0,
        "tokens_per_call": round((results[-1].tokens - 1) / c.decode_calls, 3) if c.decode_calls else 0.0,
        "declined": c.declined,
        "guarded": c.guarded,
        "batches": {str(n): k for n, k in sorted(c.batches.items())},
        "batch_steps": {str(n): round(v, 3) for n, v in c.mean_batch_steps().items()},
        "after_verify_steps": round(c.mean_after_verify_steps(), 3),
        "decode_tokens": results[-1].tokens,
        "speedup": round(statistics.median(on) / statistics.median(off), 3),
        "identical": all(r.identical for r in results),
        "graphs_reused": results[-1].graphs_reused,
        # where the batch rounding took the speculative reply elsewhere, the drafts (the plain
        # reply) stop matching there: the best case is the part both replies share
        **shared_rates(
            [TokenTimes(r.plain, r.plain_times) for r in results],
            [TokenTimes(r.spec, r.spec_times) for r in results],
        ),
    }


def format_spec_lines(s: dict[str, Any]) -> list[str]:
    n = s.get("busy_processes", 0)
    busy = f", beside {n} busy process{'es' if n > 1 else ''}" if n else ""
    lines = ["", f"speculation  max_draft {s['max_draft']}, min_match {s['min_match']}{busy}"]
    if s.get("speculation"):
        lines.append(f"  {s['speculation']}")
    src = s.get("copy_edit_source")
    if src:
        old, new = src["rename"]
        lines.append(
            f"  copy-edit: {src['file']} ({src['lines']} lines, {src['prompt_tokens']:,} prompt "
            f"tokens), `{old}` renamed to `{new}`; its reply up to {src['reply_budget']:,} tokens"
        )
    lines.append(
        f"{'workload':>12} {'off tok/s':>10} {'on tok/s':>9} {'x':>6} {'accept':>7} {'tok/call':>9} identical"
    )
    for name in ("copy-edit", "novel", "replay"):
        if name not in s:
            continue
        r = s[name]
        lines.append(
            f"{name:>12} {r['tok_s_off']:>10.1f} {r['tok_s_on']:>9.1f} {r['speedup'] or 0:>6.2f} "
            f"{r.get('acceptance', 0):>7.2f} {r.get('tokens_per_call', 0):>9.2f} {r['identical']}"
        )
    for name in ("copy-edit", "novel", "replay"):
        r = s.get(name, {})
        if r.get("shared_tokens"):
            lines.append(
                f"  {name}: the replies part after {r['shared_tokens']:,} tokens (batch rounding); "
                f"over those, {r['tok_s_off_shared']:.1f} -> {r['tok_s_on_shared']:.1f} tok/s, "
                f"{r['speedup_shared'] or 0:.2f}x"
            )
    for name in ("copy-edit", "novel", "replay"):
        r = s.get(name, {})
        if r.get("batches") or r.get("declined"):
            sizes = ", ".join(f"{n} x{c}" for n, c in r["batches"].items()) or "none"
            lines.append(
                f"  {name}: verify batches {sizes}; drafts declined {r['declined']}, "
                f"drafting stopped {r['guarded']} times"
            )
    for name in ("copy-edit", "novel", "replay"):
        r = s.get(name, {})
        if r.get("batch_steps"):
            steps = ", ".join(f"{n}: {v:.2f}" for n, v in r["batch_steps"].items())
            lines.append(
                f"  {name}: in the turn a verify of n tokens cost {steps} steps, the plain step "
                f"after one {r['after_verify_steps']:.2f} (the table below: the same batches back to back)"
            )
    costs = ", ".join(f"{k}: {v:.2f}" for k, v in s["cost"].items())
    lines.append(
        f"  verify batch of n tokens / one token ({s['cost_1_ms']:.1f} ms, "
        f"{s.get('verify_threads', 'prefill')} threads): {costs}"
    )
    if "cost_alternating" in s:
        alt = ", ".join(f"{k}: {v:.2f}" for k, v in s["cost_alternating"].items())
        lines.append(f"  the same, each after another size (a new graph each time): {alt}")
    if "cost_on_prefill_threads" in s:
        slower = ", ".join(f"{k}: {v:.2f}" for k, v in s["cost_on_prefill_threads"].items())
        lines.append(f"  the same on the prefill threads: {slower}")
    lines.append(
        f"  speedup limit from that cost: {s['limit_full']:.2f}x at full acceptance, "
        f"{s['limit_at_copy_acceptance']:.2f}x at copy-edit's"
    )
    return lines
