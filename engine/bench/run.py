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
from . import session as bench_session
from .resume import run_resume_bench
from .spec import format_spec_lines, spec_section
from .spec_source import CopyEditSource
from ..prompt.chat_template import ChatMessage
from ..engine import Engine

log = logging.getLogger(__name__)

DEFAULT_PREFILL_SIZES = (512, 2048, 8192)
DEFAULT_DECODE_TOKENS = 256


def decode_section(
    engine: Engine,
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
            engine.reset()
            note(f"decode {decode_tokens} tokens{label} (run {i + 1}/{repeats})")
            runs.append(engine.complete(messages, max_tokens=decode_tokens, ignore_eos=True).stats)
    ratios = [s.wall_ms / s.llama_eval_ms for s in runs if s.llama_eval_ms > 0]
    best = min(runs, key=lambda s: s.wall_ms / s.llama_eval_ms if s.llama_eval_ms else 9e9)
    return {
        "tokens": best.decode_tokens,
        "tok_s": round(statistics.median(s.decode_tok_s for s in runs), 2),
        "tok_s_runs": [round(s.decode_tok_s, 2) for s in runs],
        "ttft_s": round(statistics.median(s.ttft_s for s in runs), 4),
        "wall_ms": round(statistics.median(s.wall_ms for s in runs), 2),
        "llama_eval_ms": round(statistics.median(s.llama_eval_ms for s in runs), 2),
        "overhead": round(statistics.median(ratios), 4) if ratios else None,
        "overhead_runs": [round(r, 4) for r in ratios],
        "graphs_reused": best.graphs_reused,
        "repeats": repeats,
        "threads_after": list(engine.threads_now),  # (decode, prefill) at the end
        "other_cores": load.get("other_cores"),  # CPU the rest of the machine used meanwhile
        "own_cores": load.get("own_cores"),  # CPU this process used (a spinning GPU wait: ~1)
    }


def run_bench(
    engine: Engine,
    *,
    profile_name: str,
    prefill_sizes=DEFAULT_PREFILL_SIZES,
    decode_tokens: int = DEFAULT_DECODE_TOKENS,
    repeats: int = 3,
    resume_tokens: int = 0,
    load: int = 0,
    load_same_session: bool = False,
    load_cgroup: bool = False,
    thread_counts: tuple[int, ...] = (),
    on_progress: Callable[[str], None] | None = None,
    spec: bool = False,
    spec_source: CopyEditSource | None = None,
    spec_copy_tokens: int | None = None,
) -> BenchResult:
    """Run every section. `thread_counts`: decode again with each fixed count (the threads
    section); `load`: decode again beside that many busy processes (the load section, with the
    fixed counts too; `load_same_session` starts them as this process's children,
    `load_cgroup` in a cgroup beside this process's, see
    `engine/bench/load.py`). With `resume_tokens`, the resume section runs last and closes the engine
    (its fresh-process probe must not share the machine with a second copy). `spec_copy_tokens`:
    the `--spec` copy-edit reply's length (None: the whole file, `spec.copy_edit_budget`)."""
    note = on_progress or (lambda _s: None)
    info = engine.info
    assert info is not None, "load the engine first"
    plan = engine.thread_plan
    result = BenchResult(
        model=str(engine.model_path.name),
        architecture=info.architecture,
        profile=profile_name,
        n_ctx=info.n_ctx,
        n_threads=info.n_threads,
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
        "mode": info.ple_gather,
        "reason": info.ple_reason,
        "graph_splits": info.graph_splits,
    }
    if spec:  # `bench --spec`: the speculation section alone (engine/bench/spec.py), beside
        # `load` busy processes when asked (off and on alike: the two columns share the load)
        busy = busy_processes(load, same_session=load_same_session, cgroup=load_cgroup) if load else None
        with busy or contextlib.nullcontext():
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
    room = info.n_ctx - decode_tokens - 16
    sizes = sorted({min(s, room) for s in prefill_sizes if s > 0})
    # Prefill and decode are measured cold: no checkpoint may shorten a prefill here.
    with engine.checkpoints_at(None):
        for size in sizes:
            messages = conversation_of(engine, size)
            engine.reset()
            note(f"prefill {size} tokens")
            stats = engine.complete(messages, max_tokens=1).stats
            result.prefill.append(
                {
                    "tokens": stats.prefill_tokens,
                    "tok_s": round(stats.prefill_tok_s, 1),
                    "ttft_s": round(stats.ttft_s, 4),
                    "llama_prompt_eval_ms": round(stats.llama_prompt_eval_ms, 2),
                }
            )
        messages = conversation_of(engine, min(128, room))

        def decode(label: str = "") -> dict[str, Any]:
            return decode_section(
                engine, messages, decode_tokens=decode_tokens, repeats=repeats, note=note, label=label
            )

        result.decode = decode()
        if thread_counts:
            result.sections["threads"] = threads_section(engine, decode, thread_counts, auto=result.decode)
        if load > 0:
            with busy_processes(load, same_session=load_same_session, cgroup=load_cgroup):
                result.sections["load"] = load_section(
                    engine,
                    decode,
                    load,
                    thread_counts,
                    idle=result,
                    same_session=load_same_session,
                    cgroup=load_cgroup,
                )
    engine.reset()
    if resume_tokens > 0:
        with tempfile.TemporaryDirectory(prefix="velo-bench-session-") as tmp:
            note(f"resume: a 3-turn session of {resume_tokens} tokens, warm and cold")
            session = bench_session.prepare(engine, Path(tmp), tokens=resume_tokens)
            note(f"resume: a {resume_tokens}-token conversation cold, warm and from disk")
            result.sections["resume"] = run_resume_bench(engine, tokens=resume_tokens)
            note("resume: the session's last follow-up from disk in a fresh process")
            result.sections["resume_session"] = bench_session.probe(session)
    return result


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
            f"   checkpoint file/state {r['file_over_state']:.4f}",
        ]
    s = result.sections.get("resume_session")
    if s:
        lines += bench_session.format_lines(s)
    sp = result.sections.get("speculation")
    if sp:
        lines += format_spec_lines(sp)
    return "\n".join(lines)
