"""What `tui_decode.py` drives and reads: the prompts of its two kinds of reply (prose, and one
long fenced code block), a `velo-chat` TUI in a tmux server of its own, a temporary
VELO_CHAT_HOME with the model linked in and sessions of Markdown prefilled, the stored replies in
the session database, and the machine's load from /proc.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROMPTS = {
    # SmolLM2 answers it in prose past 300 tokens.
    "prose": "Write a long story about a lighthouse keeper.",
    # SmolLM2 answers it with one fenced Python block of about 40 lines, still open at the
    # 300th token: the transcript's code path as a block grows.
    "code": (
        "Write a long Python module with a class for a bank account, a class for a bank, and "
        "functions to deposit, withdraw and transfer money, with docstrings."
    ),
}
WARM_PROMPT = "Say hello."
READY_MARK = "reuses "  # the resume-cost line: shown once the model is loaded and idle
WORDS = (
    "the lighthouse keeper walked along rocky coast every evening while storms gathered over "
    "grey water and ships passed slowly beyond reef carrying timber salt wool letters from "
    "distant harbours he wrote careful notes about wind tide fog lamp oil brass gears clockwork "
    "that turned great lens village children climbed stairs asked questions about whales "
    "stars winter bread nets gulls"
).split()
CLK_TCK = os.sysconf("SC_CLK_TCK")

# With --ui-cpu the TUI runs under this hook. It watches the events on their way to the UI and,
# for the reply, writes to VELO_BENCH_TOKENS the CPU seconds the UI thread (the main thread's CPU
# clock) used from the first token to the last, and the decode's wall time. With
# VELO_BENCH_PROFILE_TUI it also runs the app under cProfile and dumps the stats there on quit.
_TUI_HOOK = """\
import cProfile, json, os, sys, threading, time
import velo_chat.app.generation as generation
from velo_chat.engine import TokenDelta
from velo_chat.app.cli import main

_record = generation.record
_ui_clock = time.pthread_getcpuclockid(threading.main_thread().ident)


def record(events, turn):
    first = last = None
    for event in _record(events, turn):
        if isinstance(event, TokenDelta):
            now = (event.t, time.clock_gettime(_ui_clock))
            if first is None:
                first = now
            last = now
        yield event
    if first is not None:
        out = {"decode_s": round(last[0] - first[0], 4), "ui_cpu_s": round(last[1] - first[1], 4)}
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
    """`velo-chat ARGS` as a user starts it: the console script beside this interpreter (`hooked`:
    this interpreter under the hook above)."""
    if hooked:
        return [sys.executable, "-c", _TUI_HOOK, *args]
    script = Path(sys.executable).with_name("velo-chat")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "velo_chat.app.cli", *args]


# -- the isolated home ------------------------------------------------------------------------


def make_home(root: Path, model: Path, profiles: list[str], tokens: int) -> Path:
    """A VELO_CHAT_HOME with the default model linked in and each profile overlaid with greedy
    sampling and `tokens` max tokens."""
    models = root / "data" / "models"
    models.mkdir(parents=True)
    (models / model.name).symlink_to(model)
    overlays = root / "config" / "profiles"
    overlays.mkdir(parents=True)
    for name in profiles:
        (overlays / f"{name}.toml").write_text(f"[sampling]\ntemperature = 0.0\nmax_tokens = {tokens}\n")
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


def prefill_session(db: Path, profile: str, title: str, words: int) -> str:
    """A session holding `words` words of transcript (user questions and Markdown answers)."""
    from velo_chat.store import SessionStore

    rng = random.Random(7)  # the same transcript for every copy
    with SessionStore(db) as store:
        session = store.create_session(profile, title=title)
        written = 0
        while written < words:
            question = " ".join(rng.choices(WORDS, k=12)).capitalize() + "?"
            store.add_message(session.id, "user", question)
            n = 600
            store.add_message(session.id, "assistant", markdown_reply(rng, n))
            written += n + 12
        return session.id


def _query(db: Path, sql: str, args: tuple[Any, ...] = ()) -> Any:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute(sql, args).fetchone()
    finally:
        con.close()


def last_id(db: Path) -> int:
    return int(_query(db, "SELECT COALESCE(MAX(id), 0) FROM messages")[0]) if db.exists() else 0


def finished_reply(db: Path, after_id: int) -> tuple[int, str, dict[str, Any]] | None:
    """The newest assistant reply with an id above `after_id` once it is stored `complete` with
    its stats: (id, session id, stats)."""
    row = _query(
        db,
        "SELECT id, session_id, status, stats FROM messages WHERE role = 'assistant' AND id > ? "
        "ORDER BY id DESC LIMIT 1",
        (after_id,),
    )
    if row is None or row[2] != "complete":
        return None
    stats = json.loads(row[3] or "{}")
    return (row[0], row[1], stats) if "decode_tok_s" in stats else None


# -- the machine ------------------------------------------------------------------------------


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat: not idle, not iowait)."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / CLK_TCK


def process_cpu(pid: int) -> float:
    """CPU seconds process `pid` has used (every thread)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def others_cores(t0: float, busy0: float, own0: float, t1: float, busy1: float, own1: float) -> float:
    """Cores the rest of the machine used between two samples."""
    return round(max(0.0, (busy1 - busy0) - (own1 - own0)) / max(t1 - t0, 1e-9), 2)


# -- the TUI in tmux --------------------------------------------------------------------------


class TmuxApp:
    """One `velo-chat` TUI in a tmux server of its own (its socket in the run's folder)."""

    def __init__(self, home: Path, profile: str, size: tuple[int, int], socket: Path, hooked: bool) -> None:
        self.socket = socket
        self.hooked = hooked
        self.tokens_log = home / "bench-tokens.jsonl"
        env = {"VELO_CHAT_HOME": str(home), "TERM": "xterm-256color", "COLORTERM": "truecolor"}
        for key in ("PYTHONPATH", "VELO_BENCH_PROFILE_TUI"):
            if os.environ.get(key) and (hooked or key == "PYTHONPATH"):
                env[key] = os.environ[key]
        if hooked:
            env["VELO_BENCH_TOKENS"] = str(self.tokens_log)
        argv = velo_cmd("--profile", profile, hooked=hooked)
        cmd = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *argv])
        self._tmux("new-session", "-d", "-s", "app", "-x", str(size[0]), "-y", str(size[1]), cmd)
        self.pid = int(self._tmux("display-message", "-p", "-t", "app", "#{pane_pid}").strip())

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-S", str(self.socket), *args], check=True, capture_output=True, text=True
        ).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "app")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "app", *keys)

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", "app", "-l", text)

    def wait_for(self, ok: Callable[[str], bool], timeout: float, what: str) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            screen = self.screen()
            if ok(screen):
                return screen
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}; the screen:\n{self.screen()}")

    def wait_ready(self) -> None:
        self.wait_for(lambda s: READY_MARK in s, 300, "the model to load")

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
        self.wait_for(lambda s: READY_MARK in s, 60, "the resume-cost line")

    def new_session(self) -> None:
        self.keys("C-n")
        self.wait_for(lambda s: "new session" in s.splitlines()[0], 30, "a new session")
        self.keys("C-l")

    def send(self, db: Path, prompt: str) -> tuple[dict[str, Any], float]:
        """Send `prompt` and wait for its stored reply: (stats, cores the others used)."""
        before = last_id(db)
        self.type(prompt)
        t0, busy0, own0 = time.monotonic(), busy_seconds(), process_cpu(self.pid)
        self.keys("Enter")
        end = time.monotonic() + 900
        while (found := finished_reply(db, before)) is None:
            if time.monotonic() > end:
                raise RuntimeError(f"no reply stored; the screen:\n{self.screen()}")
            time.sleep(0.25)
        others = others_cores(t0, busy0, own0, time.monotonic(), busy_seconds(), process_cpu(self.pid))
        return found[2], others

    def quit(self) -> None:
        try:
            self.keys("C-q")
            end = time.monotonic() + 30
            while time.monotonic() < end:
                done = subprocess.run(["tmux", "-S", str(self.socket), "has-session"], capture_output=True)
                if done.returncode:
                    return
                time.sleep(0.2)
        finally:
            subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True)
            self.socket.unlink(missing_ok=True)
