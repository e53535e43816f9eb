"""The session case of `velo-chat bench`'s resume section: a conversation of `turns` turns (3
unless `bench --session-turns` says) on the model's own chat template, and the TTFT of its last
follow-up cold and restored from disk in a fresh process.

Each follow-up before the last also reports what its checkpoints added in memory and on disk
(`growth`): bytes the RAM tier's pool and the disk directory grew by, against the largest state
that turn saved. Chunks shared with the states before are held once, so a follow-up should add
a fraction of one state.

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
import statistics
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import ChatMessage, EngineAPI, TurnStats
from ..config import profile_to_toml
from ..diagnostics import CheckpointMemory, diagnostics, follow_up_prefix

FOLLOW_UPS = (
    "Which of those points matters most, and why?",
    "Now summarize the whole discussion in one sentence.",
)
MORE_FOLLOW_UPS = (
    "Give one example of that.",
    "What would someone who disagrees say?",
    "How would you test that claim?",
)


def follow_ups(turns: int) -> list[str]:
    """The questions after the first message, the last one being the summary (`turns` - 1)."""
    middle = [FOLLOW_UPS[0]] + [
        f"{MORE_FOLLOW_UPS[i % len(MORE_FOLLOW_UPS)]} (point {i + 2})" for i in range(max(0, turns - 3))
    ]
    return [*middle[: max(0, turns - 2)], FOLLOW_UPS[1]]


@dataclass
class SessionBench:
    """What `prepare` measured and what `probe` needs."""

    model_path: str
    profile_toml: str
    files: Path  # checkpoint files after the second turn: all the fresh process gets
    messages: list[ChatMessage]
    result: dict[str, Any] = field(default_factory=dict)


def prepare(
    engine: EngineAPI, workdir: Path, *, tokens: int, reply_tokens: int = 64, turns: int = 3
) -> SessionBench:
    """Run every turn but the last (checkpoints on), then the last warm and cold, with
    `engine`."""
    from .result import conversation_of

    diag = diagnostics(engine)
    assert engine.info is not None, "load the engine first"
    questions = follow_ups(max(2, turns))
    room = engine.info.n_ctx - (len(questions) + 1) * (reply_tokens + 24) - 128
    messages = conversation_of(engine, max(64, min(tokens, room) - len(questions) * (reply_tokens + 24)))
    root, files = workdir / "session", workdir / "session-files"
    growth = []
    diag.reset()
    with diag.checkpoints_at(root):
        before = diag.checkpoint_memory()
        for question in questions:
            done = diag.complete(messages, max_tokens=reply_tokens, ignore_eos=True)
            diag.flush_checkpoints()  # written and chunked: what this turn added is settled
            after = diag.checkpoint_memory()
            growth.append(_growth(done.stats, before, after))
            before = after
            history = tuple(messages)
            messages = [
                *messages,
                ChatMessage("assistant", done.text, done.reasoning),
                ChatMessage("user", question),
            ]
        shutil.copytree(root, files)  # as when the user types the last question
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
            "turns": len(questions) + 1,
            "conversation_tokens": cold.prompt_tokens,
            "history_tokens": history_tokens,
            "reply_tokens": reply_tokens,
            "cold_ttft_s": round(cold.ttft_s, 4),
            "warm_ttft_s": round(warm.ttft_s, 4),
            "warm_cached_tokens": warm.cached_tokens,
            "growth": growth,
            **_growth_summary(growth[1:]),  # the follow-ups (the first turn writes everything)
        },
    )


def _growth(stats: TurnStats, before: CheckpointMemory, after: CheckpointMemory) -> dict[str, Any]:
    """What one turn's checkpoints added, against the largest state it saved."""
    saved = stats.checkpoint.saved if stats.checkpoint else ()
    state = max((s.bytes for s in saved), default=0)
    return {
        "prompt_tokens": stats.prompt_tokens,
        "states_saved": len(saved),
        "state_bytes": state,
        "ram_added_bytes": after.ram_held_bytes - before.ram_held_bytes,
        "disk_added_bytes": after.disk_bytes - before.disk_bytes,
        "ram_entries": after.ram_entries,
    }


def _growth_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median bytes a follow-up added, RAM and disk, over one of its states."""
    rows = [r for r in rows if r["state_bytes"]]
    if not rows:
        return {}
    return {
        "follow_up_ram_over_state": round(
            statistics.median(r["ram_added_bytes"] / r["state_bytes"] for r in rows), 4
        ),
        "follow_up_disk_over_state": round(
            statistics.median(r["disk_added_bytes"] / r["state_bytes"] for r in rows), 4
        ),
        "follow_up_state_bytes": int(statistics.median(r["state_bytes"] for r in rows)),
    }


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
    lines = [
        "",
        f"session   {r['turns']} turns, {r['conversation_tokens']:,} tokens; TTFT of the last follow-up:",
        f"          cold {r['cold_ttft_s']:.3f} s   warm (live) {r['warm_ttft_s']:.3f} s   "
        f"disk, fresh process {r['disk_ttft_s']:.3f} s (restore {r['disk_restore_s']:.3f} s,"
        f" source {r['disk_source']})",
        f"          cold/disk {r['cold_over_disk']:.1f}x   history reused from disk "
        f"{r['history_reused']:.1%} ({r['disk_cached_tokens']:,} of {r['history_tokens']:,} "
        "tokens before the question)",
    ]
    if "follow_up_ram_over_state" in r:
        lines.append(
            f"          a follow-up's checkpoints added (median of {len(r['growth']) - 1}): RAM "
            f"{r['follow_up_ram_over_state']:.2f}x, disk {r['follow_up_disk_over_state']:.2f}x of one "
            f"state ({r['follow_up_state_bytes'] / 2**20:,.1f} MiB)"
        )
    return lines
