"""Prefix checkpoints for the engine: where a turn can start from, restoring it, saving new ones.

The engine asks `find(tokens)` for the best saved state among the RAM and disk tiers, compares it
with what the live context can reuse, and calls `restore` for the winner. It calls `save` at the
save points (every `interval_tokens` inside a long prefill, the end of a prefill, the end of a
reply). Problems (a corrupt file, a full disk, a budget too small) never fail a turn: they become
warnings that the engine yields as `EngineWarning` events, and the turn goes on cold if it must.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import checkpoint_file as cf
from .checkpoint_tiers import DiskEntry, DiskTier, RamEntry, RamTier
from .llama_context import LlamaContext
from .profile_schema import CheckpointSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    n_tokens: int  # usable prefix length
    source: str  # "ram" or "disk"
    entry: RamEntry | DiskEntry


@dataclass(frozen=True)
class Restored:
    n_tokens: int
    source: str
    seconds: float


def state_layout(ctx: LlamaContext) -> dict[str, Any]:
    """The context parameters that change how a sequence state is laid out."""
    import llama_cpp

    p = ctx.params
    return {"type_k": int(p.type_k), "type_v": int(p.type_v),
            "flash_attn": int(p.flash_attn_type), "n_seq_max": int(p.n_seq_max),
            "llama_cpp_python": llama_cpp.__version__}


class Checkpoints:
    def __init__(self, settings: CheckpointSettings, *, fingerprint: str, ctx: LlamaContext,
                 hybrid: bool, root: Path) -> None:
        self.settings = settings
        self.exact = hybrid  # recurrent state cannot be rewound: only exact prefixes resume
        self._warnings: list[str] = []
        self._wlock = threading.Lock()
        self.ram = RamTier(settings.ram_budget_mib * 2**20)
        self.disk = DiskTier(root, fingerprint, state_layout(ctx),
                             int(settings.disk_budget_gib * 2**30), self._warn) \
            if settings.disk_budget_gib > 0 else None

    # -- warnings -------------------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        log.warning("%s", message)
        with self._wlock:
            self._warnings.append(message)

    def take_warnings(self) -> list[str]:
        with self._wlock:
            out, self._warnings = self._warnings, []
        return out

    # -- lookup and restore ---------------------------------------------------------------------

    def find(self, tokens: np.ndarray) -> Candidate | None:
        """The saved state covering the longest usable prefix of `tokens` (RAM wins ties)."""
        n_ram, ram = self.ram.best(tokens, exact=self.exact)
        n_disk, disk = self.disk.best(tokens, exact=self.exact) if self.disk else (0, None)
        if ram is not None and n_ram >= n_disk:
            return Candidate(n_ram, "ram", ram)
        if disk is not None:
            return Candidate(n_disk, "disk", disk)
        return None

    def restore(self, ctx: LlamaContext, cand: Candidate) -> Restored | None:
        """Load a candidate into the context (then truncate to the usable prefix on attention
        models). None, with a warning, if it fails: the context is then empty."""
        t0 = time.perf_counter()
        if isinstance(cand.entry, RamEntry):
            ok = ctx.set_state(cand.entry.state)
            self.ram.touch(cand.entry.key)
            if not ok:
                self.ram.drop(cand.entry.key)
                self._warn("llama.cpp rejected a RAM checkpoint; falling back to a cold prefill")
                return None
        else:
            assert self.disk is not None
            payload = self.disk.open_payload(cand.entry)
            if payload is None:
                ctx.clear()
                return None
            with payload:
                ok = ctx.set_state(payload.view)
            if not ok:
                self.disk.discard(cand.entry.path, "llama.cpp rejected its state")
                return None
        n_saved = len(cand.entry.tokens)
        if cand.n_tokens < n_saved and not ctx.truncate(cand.n_tokens):
            ctx.clear()
            self._warn("could not truncate a restored checkpoint; falling back to cold")
            return None
        return Restored(cand.n_tokens, cand.source, time.perf_counter() - t0)

    # -- saving ---------------------------------------------------------------------------------

    def save(self, ctx: LlamaContext, tokens: list[int]) -> tuple[int, int]:
        """Snapshot the context (which holds exactly `tokens`) into RAM and (queued) disk.
        Returns (tokens, bytes) of the snapshot, or (0, 0) if it was already saved."""
        arr = np.asarray(tokens, dtype=np.int32)
        key = cf.tokens_digest(arr)[:32]
        if key in self.ram.entries or (self.disk and key in self.disk.entries):
            self.ram.touch(key)
            return 0, 0
        state = ctx.get_state()
        self.ram.put(key, arr, state)
        if self.disk is not None:
            self.disk.save(key, arr, state)
        return len(arr), len(state)

    def flush(self, timeout: float | None = None) -> bool:
        return self.disk.flush(timeout) if self.disk else True

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
