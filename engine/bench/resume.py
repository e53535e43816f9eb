"""The resume section of `velo-chat bench`: what prefix checkpoints buy on a follow-up turn.

For a conversation of about `tokens` tokens it measures the TTFT of the same follow-up turn:
cold (no reuse), warm (the live context of the process that ran the previous turn) and restored
from disk in a fresh process (`python -m velo_chat.engine.bench.resume_probe`: a new model load, an
empty RAM tier, only the checkpoint files the first process wrote). It also compares the bytes of
the boundary checkpoint on disk with the size of the state it holds.

The benchmark's own engine is closed before the fresh process starts, so a big model is never
loaded twice.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .. import ChatMessage, EngineAPI
from ..config import profile_to_toml
from ..diagnostics import CHECKPOINT_SUFFIX, diagnostics, read_checkpoint_header

FOLLOW_UP = "Summarize all of that in one sentence."


def run_resume_bench(engine: EngineAPI, *, tokens: int, reply_tokens: int = 32) -> dict[str, Any]:
    """Measure, then close `engine` (the fresh-process probe needs the memory)."""
    from .result import conversation_of

    diag = diagnostics(engine)
    assert engine.info is not None, "load the engine first"
    first = conversation_of(engine, min(tokens, engine.info.n_ctx - reply_tokens - 64))
    with tempfile.TemporaryDirectory(prefix="velo-bench-ckpt-") as tmp:
        root, probe_root = Path(tmp) / "warm", Path(tmp) / "probe"
        diag.reset()
        with diag.checkpoints_at(root):
            reply = diag.complete(first, max_tokens=reply_tokens).text
            follow = first + [ChatMessage("assistant", reply), ChatMessage("user", FOLLOW_UP)]
            # As after a user types the follow-up: the previous turn's files are written, and
            # the fresh process gets exactly those (not what the warm turn saves next).
            diag.flush_checkpoints()
            shutil.copytree(root, probe_root)
            warm = diag.complete(follow, max_tokens=1).stats
        diag.reset()
        with diag.checkpoints_at(None):
            cold = diag.complete(follow, max_tokens=1).stats
        # Chunked checkpoints keep a small table per checkpoint and the chunks in packs shared
        # between saves: what the first turn's saves hold on disk is every file of the store,
        # set against the largest state among them.
        headers = [read_checkpoint_header(p)[0] for p in probe_root.glob(f"*/*{CHECKPOINT_SUFFIX}")]
        header = max(headers, key=lambda h: h.payload_bytes)
        file_bytes = sum(p.stat().st_size for p in probe_root.rglob("*") if p.is_file())
        profile = dataclasses.replace(
            engine.profile, checkpoints=dataclasses.replace(engine.profile.checkpoints, enabled=True)
        )
        model_path = str(diag.model_path)
        engine.close()
        probe = subprocess.run(
            [sys.executable, "-m", "velo_chat.engine.bench.resume_probe", str(probe_root), model_path],
            input=json.dumps(
                {
                    "profile_toml": profile_to_toml(profile),
                    "messages": [{"role": m.role, "content": m.content} for m in follow],
                }
            ),
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if probe.returncode != 0:
            raise RuntimeError(f"resume probe failed: {probe.stderr.strip()[-500:]}")
        disk = json.loads(probe.stdout)
    return {
        "conversation_tokens": warm.prompt_tokens,
        "cold_ttft_s": round(cold.ttft_s, 4),
        "warm_ttft_s": round(warm.ttft_s, 4),
        "warm_cached_tokens": warm.cached_tokens,
        "disk_ttft_s": round(disk["ttft_s"], 4),
        "disk_source": disk["checkpoint"]["source"],
        "disk_cached_tokens": disk["cached_tokens"],
        "disk_restore_s": disk["checkpoint"]["restore_s"],
        "disk_over_warm": round(disk["ttft_s"] / warm.ttft_s, 3),
        "cold_over_disk": round(cold.ttft_s / disk["ttft_s"], 2),
        "checkpoint_file_bytes": file_bytes,
        "state_bytes": header.payload_bytes,
        "file_over_state": round(file_bytes / header.payload_bytes, 5),
    }
