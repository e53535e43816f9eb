"""`velo-chat bench`: the measuring instrument every performance claim is quoted from.

It drives the real engine through real turns (the same code path the app uses) and reports
prefill tok/s at several prompt sizes, decode tok/s over a fixed number of greedy tokens, TTFT,
and the engine's own overhead: wall time of the decode phase over llama.cpp's `t_eval_ms` for
the same tokens (1.00 would be a Python loop that costs nothing). The threads it ran with, and
how busy the other processes kept the CPUs meanwhile, are part of the result; the threads and
load sections (`engine/bench/load.py`) decode again with fixed thread counts and beside busy processes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import platform
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .remote import format_remote_lines
from .result import BenchResult, conversation_of
from .load import busy_processes, format_load_lines, load_section, measure_load, threads_section
from . import attach as bench_attach
from . import compact as bench_compact
from . import session as bench_session
from .checkpoint_sizes import checkpoint_sizes_section
from .checkpoint_sizes import format_lines as format_checkpoint_sizes
from .resume import run_resume_bench
from .spec import format_spec_lines, spec_section
from .spec_source import CopyEditSource
from .. import ChatMessage, EngineAPI, LlamaTimings, TurnStats
from ..diagnostics import Diagnostics, diagnostics

log = logging.getLogger(__name__)

DEFAULT_PREFILL_SIZES = (512, 2048, 8192)
DEFAULT_DECODE_TOKENS = 256


def llama_timings(stats: TurnStats) -> LlamaTimings:
    """The llama.cpp timings of an in-process turn (the only kind this benchmark runs)."""
    assert stats.llama is not None, "an in-process turn reports llama.cpp's timings"
    return stats.llama


def decode_section(
    diag: Diagnostics,
    messages: list[ChatMessage],
    *,
    decode_tokens: int,
    repeats: int,
    note: Callable[[str], None],
    label: str = "",
) -> dict[str, Any]:
    """Decode `decode_tokens` greedy tokens `repeats` times from a fresh context."""
    runs = []
    with measure_load() as load:
        for i in range(repeats):
            diag.reset()
            note(f"decode {decode_tokens} tokens{label} (run {i + 1}/{repeats})")
            runs.append(diag.complete(messages, max_tokens=decode_tokens, ignore_eos=True).stats)
    timings = [llama_timings(s) for s in runs]
    ratios = [t.wall_ms / t.eval_ms for t in timings if t.eval_ms > 0]
    overhead = [t.wall_ms / t.eval_ms if t.eval_ms else 9e9 for t in timings]
    best = overhead.index(min(overhead))
    return {
        "tokens": runs[best].decode_tokens,
        "tok_s": round(statistics.median(s.decode_tok_s for s in runs), 2),
        "tok_s_runs": [round(s.decode_tok_s, 2) for s in runs],
        "ttft_s": round(statistics.median(s.ttft_s for s in runs), 4),
        "wall_ms": round(statistics.median(t.wall_ms for t in timings), 2),
        "llama_eval_ms": round(statistics.median(t.eval_ms for t in timings), 2),
        "overhead": round(statistics.median(ratios), 4) if ratios else None,
        "overhead_runs": [round(r, 4) for r in ratios],
        "graphs_reused": timings[best].graphs_reused,
        "repeats": repeats,
        "threads_after": list(diag.threads_now),  # (decode, prefill) at the end
        "other_cores": load.get("other_cores"),  # CPU the rest of the machine used meanwhile
        "own_cores": load.get("own_cores"),  # CPU this process used (a spinning GPU wait: ~1)
    }


def run_bench(
    engine: EngineAPI,
    *,
    profile_name: str,
    prefill_sizes=DEFAULT_PREFILL_SIZES,
    decode_tokens: int = DEFAULT_DECODE_TOKENS,
    repeats: int = 3,
    resume_tokens: int = 0,
    session_turns: int = 3,
    ckpt_sizes: tuple[int, ...] = (),
    load: int = 0,
    load_same_session: bool = False,
    load_cgroup: bool = False,
    thread_counts: tuple[int, ...] = (),
    on_progress: Callable[[str], None] | None = None,
    spec: bool = False,
    spec_source: CopyEditSource | None = None,
    spec_copy_tokens: int | None = None,
    attach_lines: int = 0,
    compact: bool = False,
) -> BenchResult:
    """Run every section on an in-process engine (`NoDiagnostics` for another).
    `thread_counts`: decode again with each fixed count (the threads section); `load`: decode
    again beside that many busy processes (the load section, with the fixed counts too;
    `load_same_session` starts them as this process's children, `load_cgroup` in a cgroup beside
    this process's, see `engine/bench/load.py`). With `resume_tokens`, the resume section (its
    session `session_turns` long) runs last and closes the engine (its fresh-process probe must
    not share the machine with a second copy). `spec_copy_tokens`: the `--spec` copy-edit
    reply's length (None: the whole file, `spec.copy_edit_budget`). `attach_lines`: run the
    attach section (`attach.py`) with a file of that many lines (0: not at all); it closes the
    engine too, for the same reason.
    `ckpt_sizes`: run the checkpoint-sizes section (`checkpoint_sizes.py`) at those sizes.
    `compact`: run the compaction section (`compact.py`: a conversation filled to `compact_at`,
    its summary turn warm against cold, the continuation's first follow-up)."""
    note = on_progress or (lambda _s: None)
    diag = diagnostics(engine)
    result = _result_of(engine, diag, profile_name)
    busy = functools.partial(busy_processes, load, same_session=load_same_session, cgroup=load_cgroup)
    if spec:  # `bench --spec`: the speculation section alone (engine/bench/spec.py), beside
        # `load` busy processes when asked (off and on alike: the two columns share the load)
        with busy() if load else contextlib.nullcontext():
            section = spec_section(
                engine,
                decode_tokens=decode_tokens,
                repeats=repeats,
                note=note,
                source=spec_source,
                copy_tokens=spec_copy_tokens,
            )
        if load:
            section["busy_processes"] = load
        result.sections["speculation"] = section
        return result
    # Prefill and decode are measured cold: no checkpoint may shorten a prefill here.
    with diag.checkpoints_at(None):
        room = _prefill_rows(engine, diag, result, prefill_sizes, decode_tokens, note)
        messages = conversation_of(engine, min(128, room))

        def decode(label: str = "") -> dict[str, Any]:
            return decode_section(
                diag, messages, decode_tokens=decode_tokens, repeats=repeats, note=note, label=label
            )

        result.decode = decode()
        if thread_counts:
            result.sections["threads"] = threads_section(diag, decode, thread_counts, auto=result.decode)
        if load > 0:
            with busy():
                result.sections["load"] = load_section(
                    diag,
                    decode,
                    load,
                    thread_counts,
                    idle=result,
                    same_session=load_same_session,
                    cgroup=load_cgroup,
                )
    diag.reset()
    if ckpt_sizes:
        result.sections["checkpoint_sizes"] = checkpoint_sizes_section(engine, ckpt_sizes, note)
    if compact:
        note("compact: a conversation filled to compact_at, its summary turn warm and cold")
        result.sections["compaction"] = bench_compact.run_compact_bench(engine)
    if resume_tokens > 0 or attach_lines > 0:
        result.sections.update(
            _fresh_process_sections(engine, resume_tokens, attach_lines, note, session_turns=session_turns)
        )
    return result


def _result_of(engine: EngineAPI, diag: Diagnostics, profile_name: str) -> BenchResult:
    """The result's header: the model, the machine, the thread plan and the PLE path."""
    info = engine.info
    assert info is not None, "load the engine first"
    plan = diag.thread_plan
    result = BenchResult(
        model=str(diag.model_path.name),
        architecture=info.architecture,
        profile=profile_name,
        n_ctx=info.n_ctx,
        n_threads=info.threads.decode if info.threads is not None else 0,
        hybrid=info.hybrid,
        machine=f"{platform.machine()} {platform.system()}",
        threads={
            "decode": plan.decode,
            "prefill": plan.batch,
            "n_threads": plan.decode_setting,
            "n_threads_batch": plan.batch_setting,
            "gpu_resident": plan.gpu_resident,
            "cores": plan.cores,
            "adapt": plan.adapt,
            "pool": plan.pool,
            "poll": plan.poll,
            "gpu_wait": plan.gpu_wait.as_dict() if plan.gpu_wait else None,
            "plan": plan.describe(),
        },
    )
    result.sections["ple"] = {  # docs/ple.md
        "mode": info.ple.gather if info.ple is not None else "",
        "reason": info.ple.reason if info.ple is not None else "",
        "graph_splits": info.local.graph_splits if info.local is not None else 0,
    }
    return result


def _prefill_rows(
    engine: EngineAPI,
    diag: Diagnostics,
    result: BenchResult,
    prefill_sizes,
    decode_tokens: int,
    note: Callable[[str], None],
) -> int:
    """One cold prefill of each size (as far as the context leaves room for the decode after
    it) into `result.prefill`; returns that room."""
    assert engine.info is not None
    room = engine.info.n_ctx - decode_tokens - 16
    for size in sorted({min(s, room) for s in prefill_sizes if s > 0}):
        messages = conversation_of(engine, size)
        diag.reset()
        note(f"prefill {size} tokens")
        stats = diag.complete(messages, max_tokens=1).stats
        result.prefill.append(
            {
                "tokens": stats.prefill_tokens,
                "tok_s": round(stats.prefill_tok_s, 1),
                "ttft_s": round(stats.ttft_s, 4),
                "llama_prompt_eval_ms": round(llama_timings(stats).prompt_eval_ms, 2),
            }
        )
    return room


def _fresh_process_sections(
    engine: EngineAPI,
    resume_tokens: int,
    attach_lines: int,
    note: Callable[[str], None],
    *,
    session_turns: int = 3,
) -> dict[str, Any]:
    """The sections whose last turn runs in a fresh process: resume (`resume.py`, `session.py`,
    when `resume_tokens`) and attach (`attach.py`, when `attach_lines`). Every turn of the
    benchmark's engine runs first, then the engine is closed, then the fresh processes run one
    at a time, so a big model is never loaded twice at once."""
    sections: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="velo-bench-session-") as tmp:
        session = attach = None
        if resume_tokens > 0:
            note(f"resume: a {session_turns}-turn session of {resume_tokens} tokens, warm and cold")
            session = bench_session.prepare(engine, Path(tmp), tokens=resume_tokens, turns=session_turns)
        if attach_lines > 0:
            note(f"attach: a file of {attach_lines} lines and a follow-up, warm and cold")
            attach = bench_attach.prepare(engine, Path(tmp), lines=attach_lines)
        if resume_tokens > 0:
            note(f"resume: a {resume_tokens}-token conversation cold, warm and from disk")
            sections["resume"] = run_resume_bench(engine, tokens=resume_tokens)  # closes the engine
        else:
            engine.close()
        if session is not None:
            note("resume: the session's last follow-up from disk in a fresh process")
            sections["resume_session"] = bench_session.probe(session)
        if attach is not None:
            note("attach: the follow-up from disk in a fresh process")
            sections["attach"] = bench_attach.probe(attach)
    return sections


def format_table(result: BenchResult) -> str:
    lines = [
        f"model     {result.model} ({result.architecture}, hybrid={result.hybrid})",
        f"profile   {result.profile}   n_ctx {result.n_ctx}   {result.machine}",
        f"threads   {result.threads.get('plan', result.n_threads)}",
        "",
        f"{'prefill tokens':>15} {'tok/s':>10} {'TTFT s':>9}",
    ]
    for row in result.prefill:
        lines.append(f"{row['tokens']:>15,} {row['tok_s']:>10,.1f} {row['ttft_s']:>9.3f}")
    d = result.decode
    if d:
        lines += [
            "",
            f"decode    {d['tokens']} tokens greedy: {d['tok_s']:.1f} tok/s (median of "
            f"{d['repeats']}), graphs reused {d['graphs_reused']}",
        ]
        if d.get("overhead") is not None:
            lines.append(
                f"overhead  wall {d['wall_ms']:.1f} ms / llama eval {d['llama_eval_ms']:.1f} ms = "
                f"{d['overhead']:.4f}  (runs: {', '.join(f'{r:.4f}' for r in d['overhead_runs'])})"
            )
        if result.architecture == "remote":
            lines += format_remote_lines(result)
        else:
            lines += format_load_lines(result)
    r = result.sections.get("resume")
    if r:
        lines += [
            "",
            f"resume    follow-up to a {r['conversation_tokens']:,}-token conversation, TTFT:",
            f"          cold {r['cold_ttft_s']:.3f} s   warm (live) {r['warm_ttft_s']:.3f} s   "
            f"disk, fresh process {r['disk_ttft_s']:.3f} s (restore {r['disk_restore_s']:.3f} s,"
            f" source {r['disk_source']})",
            f"          disk/warm {r['disk_over_warm']:.2f}x   cold/disk {r['cold_over_disk']:.1f}x"
            f"   checkpoint files on disk/largest state {r['file_over_state']:.4f}",
        ]
    cs = result.sections.get("checkpoint_sizes")
    if cs:
        lines += format_checkpoint_sizes(cs)
    s = result.sections.get("resume_session")
    if s:
        lines += bench_session.format_lines(s)
    a = result.sections.get("attach")
    if a:
        lines += bench_attach.format_lines(a)
    c = result.sections.get("compaction")
    if c:
        lines += bench_compact.format_lines(c)
    sp = result.sections.get("speculation")
    if sp:
        lines += format_spec_lines(sp)
    return "\n".join(lines)
