"""The attach section of `velo-chat bench`: a coding session with a source file attached.

What a user does: attach a file of about 1,500 lines, ask about it, and come back to the session
later (the next morning, or `velo-chat ask --session` again) with a second question about it.
That second question's prompt is the whole file again, so without checkpoints its TTFT is a
prefill of thousands of tokens; the product's target is a follow-up at least ten times faster
from the disk checkpoints than cold.

The file is the first lines of the standard library's `argparse.py`: real code no one wrote for
this benchmark, the same on every machine that runs the same Python. It is attached the way the
app attaches a file (`velo_chat.engine.render_user_content`), so the prompt's tokens are exactly
what a user's would be. Where the context cannot hold the file and the turns, the section takes
the most lines that fit and reports how many it used.

It runs in two parts as the session case does (`engine/bench/session.py`), so a big model is
never loaded twice at a time: `prepare` runs the first turn with the benchmark's engine, then the
follow-up live and cold; `probe` (after the engine is closed) asks the follow-up in a fresh
process given only the checkpoint files of the first turn.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import ChatMessage, EngineAPI, PromptTooLong, render_block, render_user_content
from ..config import profile_to_toml
from ..diagnostics import Diagnostics, diagnostics, follow_up_prefix
from . import session as bench_session

ATTACH_PATH = "argparse.py"  # the path the file is attached under (never a machine's folder)
ATTACH_LINES = 1500
QUESTIONS = (
    "What does this file do? Answer in a few sentences.",
    "Which class in it would I subclass to add a new kind of action, and which method must I write?",
)
MARGIN_TOKENS = 64  # the template's own tokens around the second question, and slack


@dataclass(frozen=True, slots=True)
class AttachedFile:
    """A file as the app attaches it (`velo_chat.engine.FileText`): its path and its text."""

    path: str
    content: str

    @property
    def lines(self) -> int:
        return len(self.content.splitlines())


def source_lines(lines: int) -> AttachedFile:
    """The first `lines` lines of the standard library's `argparse.py`, attached as
    "argparse.py"."""
    import argparse
    import inspect

    kept = inspect.getsource(argparse).splitlines(keepends=True)[:lines]
    return AttachedFile(ATTACH_PATH, "".join(kept))


def first_message(file: AttachedFile) -> ChatMessage:
    """The first user message: the file's block, then the first question."""
    return ChatMessage("user", render_user_content([file], QUESTIONS[0]))


def lines_that_fit(tokens_of: Callable[[int], int], most: int, budget: int) -> int:
    """The most lines (at most `most`) whose first prompt `tokens_of(lines)` stays within
    `budget` tokens; 0 when not even one line does. A search, since the prompt grows with each
    line kept."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokens_of(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def fitted_file(diag: Diagnostics, n_ctx: int, *, lines: int, reply_tokens: int) -> AttachedFile:
    """The file of `lines` lines, or fewer where the context must also hold two replies and
    the second question."""
    question = len(diag.tokens_for([ChatMessage("user", QUESTIONS[1])]))
    budget = n_ctx - 2 * reply_tokens - question - MARGIN_TOKENS

    def tokens_of(n: int) -> int:
        return len(diag.tokens_for([first_message(source_lines(n))]))

    kept = lines_that_fit(tokens_of, lines, budget)
    if kept == 0:
        raise PromptTooLong(
            f"bench --attach: a context of {n_ctx:,} tokens holds no line of {ATTACH_PATH} beside "
            "two replies; use a profile with a larger n_ctx"
        )
    return source_lines(kept)


def prepare(
    engine: EngineAPI, workdir: Path, *, lines: int = ATTACH_LINES, reply_tokens: int = 64
) -> bench_session.SessionBench:
    """Run the first turn (checkpoints on, nothing to restore: it prefills the file), then the
    follow-up live and cold, with `engine`; the checkpoint files of the first turn are kept for
    `probe`."""
    diag = diagnostics(engine)
    assert engine.info is not None, "load the engine first"
    file = fitted_file(diag, engine.info.n_ctx, lines=lines, reply_tokens=reply_tokens)
    first = [first_message(file)]
    root, files = workdir / "attach", workdir / "attach-files"
    diag.reset()
    with diag.checkpoints_at(root):
        done = diag.complete(first, max_tokens=reply_tokens, ignore_eos=True)
        messages = [
            *first,
            ChatMessage("assistant", done.text, done.reasoning),
            ChatMessage("user", QUESTIONS[1]),
        ]
        diag.flush_checkpoints()
        shutil.copytree(root, files)  # as when the user comes back with the second question
        history_tokens = len(follow_up_prefix(diag.tokens_for, first, done.text, reasoning=done.reasoning))
        warm = diag.complete(messages, max_tokens=1).stats
    diag.reset()
    with diag.checkpoints_at(None):
        cold = diag.complete(messages, max_tokens=1).stats
    diag.reset()
    profile = replace(engine.profile, checkpoints=replace(engine.profile.checkpoints, enabled=True))
    return bench_session.SessionBench(
        str(diag.model_path),
        profile_to_toml(profile),
        files,
        messages,
        {
            "turns": 2,
            "file": file.path,
            "file_lines": file.lines,
            "file_lines_asked": lines,
            "file_tokens": engine.count_tokens(render_block(file)) or 0,
            "first_prompt_tokens": done.stats.prompt_tokens,
            "first_ttft_s": round(done.stats.ttft_s, 4),
            "reply_tokens": done.stats.decode_tokens,
            "conversation_tokens": cold.prompt_tokens,
            "history_tokens": history_tokens,
            "cold_ttft_s": round(cold.ttft_s, 4),
            "warm_ttft_s": round(warm.ttft_s, 4),
            "warm_cached_tokens": warm.cached_tokens,
        },
    )


def probe(prepared: bench_session.SessionBench) -> dict[str, Any]:
    """The follow-up in a fresh process on the first turn's files (the engine must be closed):
    the section's numbers, with whether it resumed from disk."""
    r = bench_session.probe(prepared)
    r["resumed_from_disk"] = r["disk_source"] == "disk" and r["disk_cached_tokens"] > 0
    return r


def format_lines(r: dict[str, Any]) -> list[str]:
    fewer = f" (of {r['file_lines_asked']:,} asked: the context holds no more)"
    return [
        "",
        f"attach    {r['file']}: {r['file_lines']:,} lines, {r['file_tokens']:,} tokens"
        + (fewer if r["file_lines"] < r["file_lines_asked"] else ""),
        f"          first turn {r['first_prompt_tokens']:,} tokens, TTFT {r['first_ttft_s']:.3f} s "
        "(cold: it prefills the file)",
        f"          follow-up {r['conversation_tokens']:,} tokens, TTFT: cold {r['cold_ttft_s']:.3f} s   "
        f"warm (live) {r['warm_ttft_s']:.3f} s",
        f"          disk, fresh process {r['disk_ttft_s']:.3f} s (restore {r['disk_restore_s']:.3f} s, "
        f"source {r['disk_source']})",
        f"          cold/disk {_ratio(r['cold_over_disk'])}   reused from disk {r['disk_cached_tokens']:,} "
        f"of {r['history_tokens']:,} tokens before the question"
        + ("" if r["resumed_from_disk"] else "   (did not resume from disk)"),
    ]


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}x"
