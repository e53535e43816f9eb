"""Decode tok/s of the TUI in a real terminal against `velo-chat ask`, same run, JSON and a table.

The TUI runs as a user runs it: `velo-chat` in a tmux pane (a real pseudo-terminal: Textual's
Linux driver writes every frame, tmux parses it), driven with `send-keys`. `velo-chat ask` runs
the same turn from its own process: the same profile (greedy, the same max tokens, the same
threads), the same prompt, the same conversation before it. The two alternate (ask first in even
runs, the TUI first in odd ones) so both see the same machine. Each reply's decode rate is read
from the stats the app stored in the session database (`messages.stats`), the same figure for
both.

Two cases: `short` (a new session) and `long` (a session already holding several thousand tokens
of Markdown transcript, all on screen in the TUI, before the measured reply). Everything lives in
a temporary VELO_CHAT_HOME with the default model linked in; nothing touches the user's files.

    .venv/bin/python benchmarks/tui_decode.py [--tokens 256] [--repeats 2] [--size 120x40]

`VELO_BENCH_PROFILE_TUI=FILE` runs the TUI under cProfile (its UI thread) and writes the stats
to FILE when it quits; the figures of that run are then not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "Write a long story about a lighthouse keeper."
PROFILE = "bench"
READY_MARK = "reuses "  # the resume-cost line: shown once the model is loaded and idle
BUSY_MARK = "Esc stops"  # the same line while a reply streams
WORDS = (
    "the lighthouse keeper walked along rocky coast every evening while storms gathered over "
    "grey water and ships passed slowly beyond reef carrying timber salt wool letters from "
    "distant harbours he wrote careful notes about wind tide fog lamp oil brass gears clockwork "
    "that turned great lens village children climbed stairs asked questions about whales "
    "stars winter bread nets gulls"
).split()

# The TUI runs under this hook. It watches the events on their way to the UI and, for each reply,
# writes to VELO_BENCH_TOKENS the CPU seconds that the UI thread (the main thread's CPU clock),
# the whole process and the tmux server (the pane's parent: `env` execs the app) used from the
# first token to the last (to the end of the turn for tmux, read from schedstat), and the decode's
# wall time: the UI's share of a core over the decode itself, without sampling. With
# VELO_BENCH_PROFILE_TUI it also runs the app under cProfile and dumps the stats there when it
# quits.
_TUI_HOOK = """\
import cProfile, json, os, sys, threading, time
import velo_chat.app.generation as generation
from velo_chat.engine import TokenDelta
from velo_chat.app.cli import main

_record = generation.record
_ui_clock = time.pthread_getcpuclockid(threading.main_thread().ident)


def tmux_cpu():
    try:
        with open(f"/proc/{os.getppid()}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def record(events, turn):
    first = last = None
    for event in _record(events, turn):
        if isinstance(event, TokenDelta):
            now = (event.t, time.clock_gettime(_ui_clock), time.process_time())
            if first is None:
                first, tmux0 = now, tmux_cpu()
            last = now
        yield event
    if first is not None:
        span = last[0] - first[0]
        out = {"decode_s": round(span, 4), "ui_cpu_s": round(last[1] - first[1], 4)}
        out["other_cpu_s"] = round(last[2] - first[2] - out["ui_cpu_s"], 4)
        out["tmux_cpu_s"] = round(tmux_cpu() - tmux0, 4)
        with open(os.environ["VELO_BENCH_TOKENS"], "a") as f:
            f.write(json.dumps(out) + "\\n")


generation.record = record
profile = os.environ.get("VELO_BENCH_PROFILE_TUI")
p = cProfile.Profile() if profile else None
if p:
    p.enable()
try:
    code = main(sys.argv[1:])
finally:
    if p:
        p.disable()
        p.dump_stats(profile)
sys.exit(code)
"""


def velo_cmd(*args: str, hooked: bool = False) -> list[str]:
    """`velo-chat ARGS` with this interpreter (`hooked`: under the TUI hook above)."""
    if hooked:
        return [sys.executable, "-c", _TUI_HOOK, *args]
    return [sys.executable, "-m", "velo_chat.app.cli", *args]


# -- the isolated home ------------------------------------------------------------------------


def make_home(root: Path, model: Path, args: argparse.Namespace) -> Path:
    models = root / "data" / "models"
    models.mkdir(parents=True)
    (models / model.name).symlink_to(model)
    profiles = root / "config" / "profiles"
    profiles.mkdir(parents=True)
    threads = args.threads if args.threads in ("auto",) else int(args.threads)
    (profiles / f"{PROFILE}.toml").write_text(
        f"[context]\nn_ctx = {args.n_ctx}\nn_threads = {json.dumps(threads)}\n"
        f"[sampling]\ntemperature = 0.0\nmax_tokens = {args.tokens}\n"
    )
    return root


def markdown_reply(rng: random.Random, n_words: int) -> str:
    """A plausible assistant answer: a heading, paragraphs, a list and a code block."""
    out, left = [f"## {' '.join(rng.choices(WORDS, k=4)).capitalize()}"], n_words
    while left > 0:
        kind = rng.random()
        if kind < 0.6:
            k = rng.randint(40, 80)
            out.append(" ".join(rng.choices(WORDS, k=k)).capitalize() + ".")
        elif kind < 0.8:
            k = 0
            items = []
            for _ in range(rng.randint(3, 5)):
                n = rng.randint(5, 12)
                items.append("- **" + rng.choice(WORDS) + "**: " + " ".join(rng.choices(WORDS, k=n)))
                k += n + 1
            out.append("\n".join(items))
        else:
            lines = [
                f"{rng.choice(WORDS)}_{i} = {rng.randint(0, 999)}  # {rng.choice(WORDS)}" for i in range(6)
            ]
            out.append("```python\n" + "\n".join(lines) + "\n```")
            k = 24
        left -= k
    return "\n\n".join(out)


def prefill_session(db: Path, title: str, words: int) -> str:
    """A session holding `words` words of transcript (user questions and Markdown answers)."""
    from velo_chat.store import SessionStore

    rng = random.Random(7)  # the same transcript for every copy
    with SessionStore(db) as store:
        session = store.create_session(PROFILE, title=title)
        written = 0
        while written < words:
            question = " ".join(rng.choices(WORDS, k=12)).capitalize() + "?"
            store.add_message(session.id, "user", question)
            n = 600
            store.add_message(session.id, "assistant", markdown_reply(rng, n))
            written += n + 12
        return session.id


def reply_stats(db: Path, after_id: int) -> tuple[int, dict] | None:
    """The newest finished assistant reply with an id above `after_id`: (id, stats)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = con.execute(
            "SELECT id, stats FROM messages WHERE role = 'assistant' AND id > ? ORDER BY id DESC LIMIT 1",
            (after_id,),
        ).fetchone()
    finally:
        con.close()
    if row is None:
        return None
    stats = json.loads(row[1] or "{}")
    return (row[0], stats) if "decode_tok_s" in stats else None


def last_id(db: Path) -> int:
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0]
    finally:
        con.close()


# -- the TUI in tmux --------------------------------------------------------------------------


class TmuxApp:
    def __init__(self, home: Path, size: tuple[int, int]) -> None:
        self.socket = f"velo-bench-{os.getpid()}"
        self.home = home
        self.tokens_log = home / "bench-tokens.jsonl"
        env = {
            "VELO_CHAT_HOME": str(home),
            "TERM": "xterm-256color",
            "COLORTERM": "truecolor",
            "VELO_BENCH_TOKENS": str(self.tokens_log),
        }
        if os.environ.get("VELO_BENCH_PROFILE_TUI"):
            env["VELO_BENCH_PROFILE_TUI"] = os.environ["VELO_BENCH_PROFILE_TUI"]
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        argv = velo_cmd("--profile", PROFILE, hooked=True)
        cmd = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *argv])
        self._tmux("new-session", "-d", "-s", "app", "-x", str(size[0]), "-y", str(size[1]), cmd)

    def wait_ready(self) -> None:
        self.wait_for(lambda s: READY_MARK in s, 120, "the model to load")

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True
        ).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "app")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "app", *keys)

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", "app", "-l", text)

    def wait_for(self, ok, timeout: float, what: str) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            screen = self.screen()
            if ok(screen):
                return screen
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}; the screen:\n{self.screen()}")

    def idle(self) -> None:
        self.wait_for(lambda s: READY_MARK in s and BUSY_MARK not in s, 60, "the app to be idle")

    def open_session(self, title: str) -> None:
        """Filter the sidebar down to `title` and open it (keys retried: a loaded machine can
        take longer than one pause to move the focus). Textual moves the focus after the keys
        already queued, so the title is typed only once the filter shows it has the focus
        (typed at once, it could land in the message input)."""
        for _ in range(5):
            self.keys("C-f")
            time.sleep(0.5)
            self.type(title)
            self.wait_for(lambda s: title in s.splitlines()[1], 10, f"{title!r} in the filter")
            self.keys("Enter")  # from the filter to the list, which holds the one match
            time.sleep(0.5)
            self.keys("Home")
            self.keys("Enter")
            try:
                self.wait_for(lambda s: title in s.splitlines()[0], 10, f"session {title!r} to open")
                break
            except RuntimeError:
                continue
        else:
            raise RuntimeError(f"session {title!r} did not open; the screen:\n{self.screen()}")
        self.keys("C-l")
        self.idle()

    def new_session(self) -> None:
        self.keys("C-n")
        self.wait_for(lambda s: "new session" in s.splitlines()[0], 30, "a new session")
        self.keys("C-l")

    def quit(self) -> None:
        try:
            self.keys("C-q")
            end = time.monotonic() + 20
            while time.monotonic() < end:
                if subprocess.run(["tmux", "-L", self.socket, "has-session"], capture_output=True).returncode:
                    return
                time.sleep(0.2)
        finally:
            subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def tui_turn(app: TmuxApp, db: Path, prompt: str) -> dict:
    """The reply's stats, with the share of a core that the TUI's UI thread, its other threads
    (the decode's among them) and the tmux server used from the first token to the last, as the
    hook above measured them."""
    before = last_id(db)
    logged = app.tokens_log.read_text().count("\n") if app.tokens_log.exists() else 0
    app.type(prompt)
    app.keys("Enter")
    end = time.monotonic() + 600
    while (found := reply_stats(db, before)) is None:
        if time.monotonic() > end:
            raise RuntimeError(f"no reply stored; the screen:\n{app.screen()}")
        time.sleep(0.5)
    stats = dict(found[1])
    app.idle()
    lines = app.tokens_log.read_text().splitlines() if app.tokens_log.exists() else []
    if len(lines) > logged:
        cpu = json.loads(lines[-1])
        if cpu["decode_s"] > 0:
            for key, name in (
                ("ui_thread_cores", "ui_cpu_s"),
                ("tui_other_threads_cores", "other_cpu_s"),
                ("tmux_cores", "tmux_cpu_s"),
            ):
                stats[key] = round(cpu[name] / cpu["decode_s"], 4)
    return stats


def ask_turn(home: Path, prompt: str, session: str | None) -> dict:
    db = home / "data" / "sessions.sqlite3"
    before = last_id(db)
    args = ["ask", "--profile", PROFILE, "--json"] + (["--session", session] if session else []) + [prompt]
    env = {**os.environ, "VELO_CHAT_HOME": str(home)}
    env.pop("VELO_BENCH_PROFILE_TUI", None)
    # its own session, as from a shell in another terminal: the TUI runs in tmux's (Linux
    # shares the CPU between sessions first, so the same session would handicap one side)
    subprocess.run(
        velo_cmd(*args), env=env, check=True, capture_output=True, text=True, start_new_session=True
    )
    found = reply_stats(db, before)
    if found is None:
        raise RuntimeError("`velo-chat ask` stored no reply stats")
    return found[1]


# -- the run ----------------------------------------------------------------------------------


def summary(stats: dict) -> dict:
    return {
        "decode_tok_s": stats["decode_tok_s"],
        "decode_tokens": stats.get("decode_tokens"),
        "prompt_tokens": stats.get("prompt_tokens"),
        "cached_tokens": stats.get("cached_tokens"),  # restored from a checkpoint or the live cache
        "decode_threads": stats.get("decode_threads"),  # averaged over the decode steps
        **{k: stats[k] for k in ("ui_thread_cores", "tui_other_threads_cores", "tmux_cores") if k in stats},
        # wall time of the decode over llama.cpp's own eval time: what the process adds
        "wall_over_eval": round(stats["wall_ms"] / stats["llama_eval_ms"], 3)
        if stats.get("llama_eval_ms")
        else None,
    }


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def run(args: argparse.Namespace) -> dict:
    from velo_chat.engine.setup import require_default_model

    model = require_default_model()  # the user's copy, before the home moves
    root = Path(tempfile.mkdtemp(prefix="velo-tui-bench-"))
    home = make_home(root / "home", model, args)
    db = home / "data" / "sessions.sqlite3"
    os.environ["VELO_CHAT_HOME"] = str(home)
    width, height = (int(x) for x in args.size.split("x"))
    cases = args.cases.split(",")
    long_sessions = {}
    if "long" in cases:
        for r in range(args.repeats):
            for side in ("tui", "ask"):
                long_sessions[r, side] = prefill_session(db, f"bench-long-{r}-{side}", args.long_words)
    t0 = time.perf_counter()
    load_before = loadavg()
    app = TmuxApp(home, (width, height))
    runs = []
    try:
        app.wait_ready()
        app.new_session()
        tui_turn(app, db, "Say hello.")  # warm-up, not counted
        ask_turn(home, "Say hello.", None)
        for r in range(args.repeats):
            for case in cases:
                pair = {}
                order = ("ask", "tui") if r % 2 == 0 else ("tui", "ask")
                for side in order:
                    if side == "tui":
                        if case == "long":
                            app.open_session(f"bench-long-{r}-tui")
                        else:
                            app.new_session()
                        pair["tui"] = summary(tui_turn(app, db, PROMPT))
                    else:
                        session = long_sessions[r, "ask"] if case == "long" else None
                        pair["ask"] = summary(ask_turn(home, PROMPT, session))
                pair["ratio"] = round(pair["tui"]["decode_tok_s"] / pair["ask"]["decode_tok_s"], 3)
                runs.append({"run": r + 1, "case": case, "first": order[0], **pair})
                print(
                    f"run {r + 1} {case:5}: TUI {pair['tui']['decode_tok_s']:.1f} ask "
                    f"{pair['ask']['decode_tok_s']:.1f} tok/s -> {pair['ratio']:.3f}",
                    file=sys.stderr,
                )
    finally:
        app.quit()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    by_case = {}
    for case in cases:
        ratios = [x["ratio"] for x in runs if x["case"] == case]
        by_case[case] = {
            "ratios": ratios,
            "median": round(statistics.median(ratios), 3),
            "worst": min(ratios),
        }
    return {
        "benchmark": "tui_decode",
        "model": model.name,
        "terminal": f"tmux {width}x{height}",
        "max_tokens": args.tokens,
        "threads": args.threads,
        "n_ctx": args.n_ctx,
        "prompt": PROMPT,
        "cpus": len(os.sched_getaffinity(0)),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "runs": runs,
        "ratio_tui_over_ask": by_case,
        "target": 0.95,
        "wall_s": round(time.perf_counter() - t0, 1),
        "home": str(root) if args.keep else None,
    }


def table(result: dict) -> str:
    head: tuple[str, ...] = ("run", "case", "first", "prompt tokens", "decode tokens", "TUI tok/s")
    head += ("ask tok/s", "TUI/ask")
    head += ("cached TUI/ask", "threads TUI/ask", "UI thread", "tmux")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for x in result["runs"]:
        tui, ask = x["tui"], x["ask"]
        cells: tuple[object, ...] = (x["run"], x["case"], x["first"], f"{tui['prompt_tokens']:,}")
        cells += (tui["decode_tokens"],)
        cells += (f"{tui['decode_tok_s']:.1f}", f"{ask['decode_tok_s']:.1f}", f"{x['ratio']:.3f}")
        cells += (f"{tui['cached_tokens']}/{ask['cached_tokens']}",)
        cells += (f"{tui['decode_threads']}/{ask['decode_threads']}", tui.get("ui_thread_cores"))
        cells += (tui.get("tmux_cores"),)
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    rows.append("")
    for case, c in result["ratio_tui_over_ask"].items():
        rows.append(
            f"{case}: median TUI/ask {c['median']:.3f}, worst {c['worst']:.3f} (target {result['target']})"
        )
    rows.append(f"loadavg {result['loadavg_before']} before, {result['loadavg_after']} after")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="max tokens of each reply (greedy)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cases", default="short,long", help="short, long or both (comma-separated)")
    parser.add_argument("--size", default="120x40", help="the tmux pane, COLSxROWS")
    parser.add_argument("--threads", default="auto", help='the profile\'s n_threads ("auto" or a number)')
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--long-words", type=int, default=3600, help="transcript words before the long case")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (and print where)")
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
