"""The session case of `velo-chat bench`'s resume section: a three-turn conversation on the
model's own chat template, and the TTFT of its last follow-up cold and restored from disk in a
fresh process.

The one-follow-up case (`engine/bench/resume.py`) resumes from the boundary the first turn closed. This
one runs two replies first, as a session does, so it measures what a user sees on the third turn
and shows whether the template lets the conversation be reused at all: thinking templates
(Qwen3.5, QwQ, DeepSeek-R1, GLM) rewrite a reply once the conversation moves on, and before the
save points of `checkpoints/save_points.py` a hybrid model reused nothing of such a session.
`history_reused` is the share of the tokens before the new question that the fresh process did
not prefill.

It runs in two parts around the one-follow-up case, so a big model is loaded once and never
twice at a time: `prepare` runs the turns with the benchmark's engine and keeps the checkpoint
files the first two turns wrote; `probe` (after the engine is closed) runs the third turn in a
fresh process (`engine/bench/resume_probe.py`) on those files only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import ChatMessage, EngineAPI
from ..config import profile_to_toml
from ..diagnostics import diagnostics, follow_up_prefix

FOLLOW_UPS = (
    "Which of those points matters most, and why?",
    "Now summarize the whole discussion in one sentence.",
)


@dataclass
class SessionBench:
    """What `prepare` measured and what `probe` needs."""

    model_path: str
    profile_toml: str
    files: Path  # checkpoint files after the second turn: all the fresh process gets
    messages: list[ChatMessage]
    result: dict[str, Any] = field(default_factory=dict)


def prepare(engine: EngineAPI, workdir: Path, *, tokens: int, reply_tokens: int = 64) -> SessionBench:
    """Run turns 1 and 2 (checkpoints on), then turn 3 warm and cold, with `engine`."""
    from .result import conversation_of

    diag = diagnostics(engine)
    assert engine.info is not None, "load the engine first"
    room = engine.info.n_ctx - 3 * reply_tokens - 128
    messages = conversation_of(engine, max(64, min(tokens, room) - 2 * reply_tokens - 64))
    root, files = workdir / "session", workdir / "session-files"
    diag.reset()
    with diag.checkpoints_at(root):
        for question in FOLLOW_UPS:
            done = diag.complete(messages, max_tokens=reply_tokens, ignore_eos=True)
            history = tuple(messages)
            messages = [
                *messages,
                ChatMessage("assistant", done.text, done.reasoning),
                ChatMessage("user", question),
            ]
        diag.flush_checkpoints()
        shutil.copytree(root, files)  # as when the user types the third question
        history_tokens = len(follow_up_prefix(diag.tokens_for, history, done.text, reasoning=done.reasoning))
        warm = diag.complete(messages, max_tokens=1).stats
    diag.reset()
    with diag.checkpoints_at(None):
        cold = diag.complete(messages, max_tokens=1).stats
    diag.reset()
    profile = replace(engine.profile, checkpoints=replace(engine.profile.checkpoints, enabled=True))
    return SessionBench(
        str(diag.model_path),
        profile_to_toml(profile),
        files,
        messages,
        {
            "turns": 3,
            "conversation_tokens": cold.prompt_tokens,
            "history_tokens": history_tokens,
            "reply_tokens": reply_tokens,
            "cold_ttft_s": round(cold.ttft_s, 4),
            "warm_ttft_s": round(warm.ttft_s, 4),
            "warm_cached_tokens": warm.cached_tokens,
        },
    )


def probe(session: SessionBench) -> dict[str, Any]:
    """Turn 3 in a fresh process on the files of turns 1 and 2 (the engine must be closed)."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "velo_chat.engine.bench.resume_probe",
            str(session.files),
            session.model_path,
        ],
        input=json.dumps(
            {
                "profile_toml": session.profile_toml,
                "messages": [
                    {"role": m.role, "content": m.content, "reasoning_content": m.reasoning_content}
                    for m in session.messages
                ],
            }
        ),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if run.returncode != 0:
        raise RuntimeError(f"resume probe failed: {run.stderr.strip()[-500:]}")
    disk = json.loads(run.stdout)
    r = dict(session.result)
    r.update(
        {
            "disk_ttft_s": round(disk["ttft_s"], 4),
            "disk_source": disk["checkpoint"]["source"],
            "disk_cached_tokens": disk["cached_tokens"],
            "disk_restore_s": disk["checkpoint"]["restore_s"],
            "history_reused": round(
                min(disk["cached_tokens"], r["history_tokens"]) / max(r["history_tokens"], 1), 4
            ),
            "cold_over_disk": round(r["cold_ttft_s"] / disk["ttft_s"], 2) if disk["ttft_s"] else None,
        }
    )
    return r


def format_lines(r: dict[str, Any]) -> list[str]:
    return [
        "",
        f"session   3 turns, {r['conversation_tokens']:,} tokens; TTFT of the last follow-up:",
        f"          cold {r['cold_ttft_s']:.3f} s   warm (live) {r['warm_ttft_s']:.3f} s   "
        f"disk, fresh process {r['disk_ttft_s']:.3f} s (restore {r['disk_restore_s']:.3f} s,"
        f" source {r['disk_source']})",
        f"          cold/disk {r['cold_over_disk']:.1f}x   history reused from disk "
        f"{r['history_reused']:.1%} ({r['disk_cached_tokens']:,} of {r['history_tokens']:,} "
        "tokens before the question)",
    ]
