"""Decode tok/s of the TUI as a user runs it against `velo-chat ask`: a fresh process per reply.

A user starts `velo-chat` in a terminal, sends a message and reads the reply. So each measured
TUI reply is one fresh `velo-chat` process in a fresh tmux server (a real pseudo-terminal of
--size: Textual's Linux driver writes every frame and tmux parses it), driven with send-keys:
started, the prompt sent, waited on until the reply stored in the session database is
`complete`, quit. Against it runs one fresh `velo-chat ask --json` process, in a session of its
own as from another terminal, with the same profile, prompt and conversation before it. The two
alternate (the TUI first in even pairs, ask first in odd ones), so a load that comes and goes
falls on both alike; inside a round every profile, case and reply takes its turn, the replies'
order alternating too. Both rates are the `decode_tok_s` the app stored with the reply.

Replies (--replies): `prose`, a story, and `code`, a Python module that SmolLM2 writes as one
long fenced block (the transcript wraps, marks and highlights it as it grows); both prompts are
in `_tui_harness.PROMPTS`. Profiles (--profiles): shipped profiles as a user runs them, each
overlaid with greedy sampling and --tokens max tokens (a user profile of the same name overlays
the shipped one). Cases (--cases): `short`, a new session (--warm-turn: after a short turn, in
the same TUI process and stored before the ask); `long`, a session already holding --long-words
words of Markdown transcript, opened in the TUI (all of it in the transcript) and continued by
`ask --session` from an identical copy. Everything lives in a temporary VELO_CHAT_HOME with the default model
linked in; nothing touches the user's files.

Each side of a pair records the 1-minute load average before it and `others_cores`: the cores
the rest of the machine (tmux and this script included) used while it ran, from /proc/stat less
the measured process's own CPU time (the TUI: from sending the prompt to the stored reply; ask:
its whole run). Single pairs on a small shared machine swing by tens of percent: compare the
medians of many pairs (--pairs), not of a few.

    .venv/bin/python benchmarks/tui_decode.py [--pairs 8] [--profiles default,cpu-speculate]
        [--cases short,long] [--replies prose,code] [--tokens 300] [--warm-turn] [--size 120x40]
        [--ui-cpu]

--ui-cpu runs the TUI under a small hook that also reports the share of a core its UI thread
used over the decode (`ui_thread_cores`), and with VELO_BENCH_PROFILE_TUI=FILE runs it under
cProfile (the stats of the last reply's process land in FILE); the TUI is then not quite the
process a user starts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
from benchmarks._tui_harness import (  # noqa: E402
    PROMPTS,
    WARM_PROMPT,
    READY_MARK,
    velo_cmd,
    make_home,
    prefill_session,
    last_id,
    finished_reply,
    loadavg,
    busy_seconds,
    others_cores,
    TmuxApp,
)


# -- one side of a pair -----------------------------------------------------------------------


def side_summary(stats: dict[str, Any], load: float, others: float) -> dict[str, Any]:
    return {
        "decode_tok_s": stats["decode_tok_s"],
        "decode_tokens": stats.get("decode_tokens"),
        "prompt_tokens": stats.get("prompt_tokens"),
        "cached_tokens": stats.get("cached_tokens"),  # restored from a checkpoint or the live cache
        "decode_threads": stats.get("decode_threads"),  # averaged over the decode steps
        # wall time of the decode over llama.cpp's own eval time: what the process adds
        "wall_over_eval": round(stats["wall_ms"] / stats["llama_eval_ms"], 3)
        if stats.get("llama_eval_ms")
        else None,
        "loadavg": load,
        "others_cores": others,
    }


def tui_side(run: Run, profile: str, case: str, reply: str, pair: int) -> dict[str, Any]:
    load = loadavg()
    app = TmuxApp(run.home, profile, run.size, run.root / f"tmux-{pair}-{case}-{reply}", run.args.ui_cpu)
    try:
        app.wait_ready()
        if case == "long":
            app.open_session(run.long_title(profile, pair, reply, "tui"))
        else:
            app.new_session()
            if run.args.warm_turn:
                app.send(run.db, WARM_PROMPT)
                app.wait_for(lambda s: READY_MARK in s, 60, "the app to be idle")
        logged = len(app.tokens_log.read_text().splitlines()) if app.tokens_log.exists() else 0
        stats, others = app.send(run.db, PROMPTS[reply])
    finally:
        app.quit()
    out = side_summary(stats, load, others)
    lines = app.tokens_log.read_text().splitlines() if app.tokens_log.exists() else []
    if len(lines) > logged:
        hook = json.loads(lines[-1])
        if hook["decode_s"] > 0:
            out["ui_thread_cores"] = round(hook["ui_cpu_s"] / hook["decode_s"], 4)
    return out


def ask(run: Run, profile: str, prompt: str, session: str | None, max_tokens: int | None = None) -> float:
    """One `velo-chat ask` process, in its own session as from another terminal (Linux shares
    the CPU between sessions first, and the TUI has tmux's pane session). Returns its CPU time."""
    args = ["ask", "--profile", profile, "--json"] + (["--session", session] if session else [])
    args += ["--max-tokens", str(max_tokens)] if max_tokens else []
    env = {**os.environ, "VELO_CHAT_HOME": str(run.home)}
    env.pop("VELO_BENCH_PROFILE_TUI", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        velo_cmd(*args, prompt), env=env, check=True, capture_output=True, text=True, start_new_session=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def ask_side(run: Run, profile: str, case: str, reply: str, pair: int) -> dict[str, Any]:
    session = run.long_sessions[profile, pair, reply, "ask"] if case == "long" else None
    if case == "short" and run.args.warm_turn:
        before = last_id(run.db)
        ask(run, profile, WARM_PROMPT, None)
        warm = finished_reply(run.db, before)
        if warm is None:
            raise RuntimeError("`velo-chat ask` stored no warm-up reply")
        session = warm[1]
    load = loadavg()
    before = last_id(run.db)
    t0, busy0 = time.monotonic(), busy_seconds()
    own = ask(run, profile, PROMPTS[reply], session)
    others = others_cores(t0, busy0, 0.0, time.monotonic(), busy_seconds(), own)
    found = finished_reply(run.db, before)
    if found is None:
        raise RuntimeError("`velo-chat ask` stored no reply stats")
    return side_summary(found[2], load, others)


# -- the run ----------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace, root: Path, home: Path) -> None:
        self.args = args
        self.root = root
        self.home = home
        self.db = home / "data" / "sessions.sqlite3"
        width, height = (int(x) for x in args.size.split("x"))
        self.size = (width, height)
        self.long_sessions: dict[tuple[str, int, str, str], str] = {}
        self.profiles = args.profiles.split(",")
        self.replies = args.replies.split(",")

    def long_title(self, profile: str, pair: int, reply: str, side: str) -> str:
        """Short enough to show whole in the sidebar's filter box."""
        return f"long-{self.profiles.index(profile)}-{pair}-{reply}-{side}"


def spread(ratios: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(ratios), "ratios": ratios, "median": round(statistics.median(ratios), 3)}
    if len(ratios) >= 4:
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        out["quartiles"] = [round(q1, 3), round(q3, 3)]
    out["worst"] = min(ratios)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from velo_chat.engine.setup import require_default_model

    model = require_default_model()  # the user's copy, before the home moves
    root = Path(tempfile.mkdtemp(prefix="velo-tui-bench-"))
    profiles, cases, replies = args.profiles.split(","), args.cases.split(","), args.replies.split(",")
    unknown = set(replies) - set(PROMPTS)
    if unknown:
        raise SystemExit(f"tui_decode: unknown replies {sorted(unknown)} (known: {sorted(PROMPTS)})")
    home = make_home(root / "home", model, profiles, args.tokens)
    os.environ["VELO_CHAT_HOME"] = str(home)
    r = Run(args, root, home)
    if "long" in cases:
        for profile in profiles:
            for pair in range(args.pairs):
                for reply in replies:
                    for side in ("tui", "ask"):
                        title = r.long_title(profile, pair, reply, side)
                        r.long_sessions[profile, pair, reply, side] = prefill_session(
                            r.db, profile, title, args.long_words
                        )
    t0 = time.perf_counter()
    load_before = loadavg()
    pairs = []
    try:
        for profile in profiles:  # not counted: makes a requantized model, warms the page cache
            ask(r, profile, WARM_PROMPT, None, max_tokens=8)
        for pair in range(args.pairs):
            order = ("tui", "ask") if pair % 2 == 0 else ("ask", "tui")
            for profile in profiles:
                for case in cases:
                    for reply in replies if pair % 2 == 0 else replies[::-1]:
                        result: dict[str, Any] = {
                            "pair": pair + 1,
                            "profile": profile,
                            "case": case,
                            "reply": reply,
                            "first": order[0],
                        }
                        for side in order:
                            measure = tui_side if side == "tui" else ask_side
                            result[side] = measure(r, profile, case, reply, pair)
                        tui, ask_ = result["tui"]["decode_tok_s"], result["ask"]["decode_tok_s"]
                        result["ratio"] = round(tui / ask_, 3)
                        pairs.append(result)
                        if args.verbose:
                            print(json.dumps(result), file=sys.stderr, flush=True)
                        print(
                            f"pair {pair + 1} {profile} {case:5} {reply:5}: TUI {tui:.1f} ask {ask_:.1f} "
                            f"tok/s -> {result['ratio']:.3f} "
                            f"(load {result['tui']['loadavg']:.2f}/{result['ask']['loadavg']:.2f})",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    summary = {
        f"{profile} {case} {reply}": spread(
            [x["ratio"] for x in pairs if (x["profile"], x["case"], x["reply"]) == (profile, case, reply)]
        )
        for profile in profiles
        for case in cases
        for reply in replies
    }
    return {
        "benchmark": "tui_decode",
        "method": "a fresh TUI process in tmux per reply against a fresh `ask` process, alternated",
        "model": model.name,
        "terminal": f"tmux {args.size}",
        "max_tokens": args.tokens,
        "warm_turn": args.warm_turn,
        "prompts": {reply: PROMPTS[reply] for reply in replies},
        "cpus": len(os.sched_getaffinity(0)),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "pairs": pairs,
        "ratio_tui_over_ask": summary,
        "target": 0.95,
        "wall_s": round(time.perf_counter() - t0, 1),
        "home": str(root) if args.keep else None,
    }


def table(result: dict[str, Any]) -> str:
    head: tuple[str, ...] = ("pair", "profile", "case", "reply", "first", "TUI tok/s", "ask tok/s", "TUI/ask")
    head += ("threads TUI/ask",)
    head += ("load TUI/ask", "others' cores TUI/ask", "UI thread")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for x in result["pairs"]:
        tui, ask_ = x["tui"], x["ask"]
        cells: tuple[object, ...] = (x["pair"], x["profile"], x["case"], x["reply"], x["first"])
        cells += (f"{tui['decode_tok_s']:.1f}", f"{ask_['decode_tok_s']:.1f}", f"{x['ratio']:.3f}")
        cells += (f"{tui['decode_threads']}/{ask_['decode_threads']}",)
        cells += (
            f"{tui['loadavg']:.2f}/{ask_['loadavg']:.2f}",
            f"{tui['others_cores']}/{ask_['others_cores']}",
        )
        cells += (tui.get("ui_thread_cores", ""),)
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    rows.append("")
    for key, c in result["ratio_tui_over_ask"].items():
        quartiles = f", quartiles {c['quartiles'][0]:.3f}-{c['quartiles'][1]:.3f}" if "quartiles" in c else ""
        rows.append(
            f"{key}: median TUI/ask {c['median']:.3f} over {c['n']} pairs{quartiles}, worst {c['worst']:.3f} "
            f"(target {result['target']})"
        )
    rows.append(f"loadavg {result['loadavg_before']} before, {result['loadavg_after']} after")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="alternated pairs per profile, case and reply")
    parser.add_argument("--profiles", default="default", help="shipped profiles, comma-separated")
    parser.add_argument("--cases", default="short,long", help="short, long or both (comma-separated)")
    parser.add_argument("--replies", default="prose,code", help="prose, code or both (comma-separated)")
    parser.add_argument("--tokens", type=int, default=300, help="max tokens of each reply (greedy)")
    parser.add_argument("--warm-turn", action="store_true", help="a short turn before the measured one")
    parser.add_argument("--size", default="120x40", help="the tmux pane, COLSxROWS")
    parser.add_argument("--long-words", type=int, default=3600, help="transcript words before the long case")
    parser.add_argument("--ui-cpu", action="store_true", help="run the TUI under the UI-thread hook")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (and print where)")
    parser.add_argument("--verbose", action="store_true", help="each pair's JSON on stderr as it ends")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        sys.exit("tui_decode: tmux is needed (apt-get install tmux)")
    result = run(args)
    print(json.dumps(result))
    if not args.json_only:
        print(table(result), file=sys.stderr)


if __name__ == "__main__":
    main()
