"""The checkpoint-sizes section of `velo-chat bench` (`--ckpt-sizes 8192,32768,131072`): what a
checkpoint costs as the conversation grows, the table a long-context user sends back.

For each size, one engine, one reply token per turn:
1. cold: the conversation prefilled with checkpoints off;
2. saving: the same turn saving its checkpoints; the state's bytes, the TTFT the saves add
   against cold, the part of it the turn's own thread spent taking the snapshots (llama.cpp's
   copy of each state: the rest is what the tiers' threads cost it meanwhile), then the wait
   for their disk writes (which start during the turn); once writing chunks, once a single file;
3. from RAM: the turn again after the live sequence is forgotten, restored from the RAM tier
   (its states are chunks by then: the restore assembles them);
4. from disk: a new checkpoint store on the same files (an empty RAM tier) after the files are
   dropped from the page cache, so the restore reads the disk: chunked files (format 3);
5. the same from a single file holding the whole state (format 2), for the chunked/single ratio.

Only the turn's own times are compared; sizes larger than the context are left out.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .result import conversation_of
from .. import ChatMessage, EngineAPI, TurnStats
from ..diagnostics import (
    CHECKPOINT_SUFFIX,
    Diagnostics,
    diagnostics,
    drop_from_page_cache,
    read_checkpoint_header,
)

log = logging.getLogger(__name__)


def _turn(diag: Diagnostics, conv: list[ChatMessage]) -> dict[str, Any]:
    s: TurnStats = diag.complete(conv, max_tokens=1).stats
    c = s.checkpoint
    return {
        "ttft_s": round(s.ttft_s, 4),
        "prompt_tokens": s.prompt_tokens,
        "cached_tokens": s.cached_tokens,
        "source": s.source,
        "restore_s": round(c.restore_s, 4) if c else None,
        "saved": [[x.tokens, x.bytes] for x in c.saved] if c else [],
        "snapshot_s": round(sum(x.seconds for x in c.saved), 4) if c else 0.0,  # on the turn's thread
    }


def _from_disk(diag: Diagnostics, store: Path, conv: list[ChatMessage]) -> tuple[dict[str, Any], bool]:
    files = [p for p in store.rglob("*") if p.is_file()]
    evicted = drop_from_page_cache(files)
    diag.reset()
    with diag.checkpoints_at(store):  # a new store: an empty RAM tier, the files on disk
        return _turn(diag, conv), evicted


def _size_row(diag: Diagnostics, engine: EngineAPI, n: int, tmp: Path) -> dict[str, Any]:
    conv = conversation_of(engine, n)
    row: dict[str, Any] = {"size": n}
    diag.reset()
    with diag.checkpoints_at(None):
        row["cold"] = _turn(diag, conv)
    for chunked in (True, False):
        store = tmp / f"n{n}-{'chunked' if chunked else 'single'}"
        diag.reset()
        with diag.checkpoints_at(store, disk_chunked=chunked):
            saving = _turn(diag, conv)
            t = time.perf_counter()
            diag.flush_checkpoints()
            wait = time.perf_counter() - t
            if chunked:
                row["saving"], row["write_wait_s"] = saving, round(wait, 3)
                row["memory"] = vars(diag.checkpoint_memory())
                diag.reset()  # the live sequence goes; the RAM tier keeps the states
                row["from_ram"] = _turn(diag, conv)
            else:
                row["single_saving"], row["single_write_wait_s"] = saving, round(wait, 3)
        headers = [read_checkpoint_header(p)[0] for p in store.glob(f"*/*{CHECKPOINT_SUFFIX}")]
        row["state_bytes"] = max((h.payload_bytes for h in headers), default=0)
        key = "from_disk" if chunked else "from_single_file"
        row[key], row["page_cache_dropped"] = _from_disk(diag, store, conv)
        if chunked:
            row["file_bytes"] = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
        shutil.rmtree(store, ignore_errors=True)
    row["save_overhead_s"] = round(row["saving"]["ttft_s"] - row["cold"]["ttft_s"], 3)
    row["single_save_overhead_s"] = round(row["single_saving"]["ttft_s"] - row["cold"]["ttft_s"], 3)
    chunked_s, single_s = row["from_disk"]["restore_s"], row["from_single_file"]["restore_s"]
    row["chunked_over_single_restore"] = round(chunked_s / single_s, 3) if chunked_s and single_s else None
    return row


def checkpoint_sizes_section(
    engine: EngineAPI, sizes: Iterable[int], note: Callable[[str], None]
) -> dict[str, Any]:
    """Measure each size that fits the context (module docstring)."""
    diag = diagnostics(engine)
    assert engine.info is not None, "load the engine first"
    fitting = [n for n in sizes if n + 16 <= engine.info.n_ctx]
    rows = []
    with tempfile.TemporaryDirectory(prefix="velo-bench-ckpt-sizes-") as tmp:
        with diag.checkpoints_at(None):  # the first turn's one-off costs stay out of the rows
            diag.complete(conversation_of(engine, 64), max_tokens=1)
        for n in fitting:
            note(f"checkpoints at {n:,} tokens: cold, saving, from RAM, from disk")
            rows.append(_size_row(diag, engine, n, Path(tmp)))
    diag.reset()
    return {"sizes": rows, "skipped": [n for n in sizes if n not in fitting]}


def format_lines(section: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"{'checkpoints':<11}{'tokens':>9} {'state MiB':>10} {'saves +s':>9} {'snap s':>7} "
        f"{'1-file +s':>9} {'write s':>8} {'RAM s':>7} {'disk s':>7} {'1-file s':>8} {'cold s':>8}",
    ]
    for r in section["sizes"]:
        lines.append(
            f"{'':<11}{r['size']:>9,} {r['state_bytes'] / 2**20:>10,.1f} {r['save_overhead_s']:>+9.3f} "
            f"{r['saving']['snapshot_s']:>7.3f} {r['single_save_overhead_s']:>+9.3f} "
            f"{r['write_wait_s']:>8.3f} {r['from_ram']['restore_s'] or 0:>7.3f} "
            f"{r['from_disk']['restore_s'] or 0:>7.3f} {r['from_single_file']['restore_s'] or 0:>8.3f} "
            f"{r['cold']['ttft_s']:>8.3f}"
        )
    if section["sizes"] and not all(r["page_cache_dropped"] for r in section["sizes"]):
        lines.append("           (disk restores may have read the page cache: it could not be dropped here)")
    if section["skipped"]:
        lines.append(
            f"           not measured (larger than n_ctx): {', '.join(f'{n:,}' for n in section['skipped'])}"
        )
    return lines
