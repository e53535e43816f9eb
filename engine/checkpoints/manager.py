"""Prefix checkpoints for the engine: where a turn can start from, restoring it, saving new ones.

The engine asks `find(tokens)` for the best saved state among the RAM and disk tiers, compares it
with what the live context can reuse, and calls `restore` for the winner. It calls `save` at the
save points (every `interval_tokens` inside a long prefill, the end of a prefill, the end of a
reply). Problems (a corrupt file, a full disk, a budget too small) never fail a turn: they become
warnings that the engine yields as `EngineWarning` events, and the turn goes on cold if it must.

Memory: `ram_budget_mib` bounds every state held here, the RAM tier's and those queued for the
disk writer alike (`_make_room`). A state is snapshotted once; the RAM entry and the queued
write share that one array.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import file_format as cf
from .ram_tier import RamEntry, RamTier
from .tiers import DiskEntry, DiskTier
from ..llama.context import LlamaContext
from ..config.profile_schema import CheckpointSettings

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


DEFAULT_READ_BYTES_S = {"ram": 4 << 30, "disk": 500 << 20}
"""What a restore is assumed to read per second until one from that tier is timed: low for a
disk, so that an unmeasured restore is not preferred to a prefill it would lose to."""


def state_bytes(cand: Candidate) -> int:
    """Bytes a restore of `cand` copies into the context."""
    entry = cand.entry
    return len(entry.state) if isinstance(entry, RamEntry) else entry.header.payload_bytes


def _rank(
    n_usable: int, state_bytes: int, tier: int, tokens: np.ndarray, name: str
) -> tuple[int, int, int, int, str]:
    """`preference` across the tiers: the tier (0 = RAM) decides right after the state size."""
    return (-n_usable, state_bytes, tier, len(tokens), name)


def state_layout(ctx: LlamaContext) -> dict[str, Any]:
    """The context parameters that change how a sequence state is laid out."""
    import llama_cpp

    p = ctx.params
    return {
        "type_k": int(p.type_k),
        "type_v": int(p.type_v),
        "flash_attn": int(p.flash_attn_type),
        "n_seq_max": int(p.n_seq_max),
        "llama_cpp_python": llama_cpp.__version__,
        # recurrent-state snapshots for speculation widen the state; named only when there are
        # some, so the layouts (and disk directories) of contexts without them stay as they were
        **({"n_rs_seq": ctx.n_rs_seq} if ctx.n_rs_seq else {}),
    }


class Checkpoints:
    def __init__(
        self, settings: CheckpointSettings, *, fingerprint: str, ctx: LlamaContext, hybrid: bool, root: Path
    ) -> None:
        self.settings = settings
        self.exact = hybrid  # recurrent state cannot be rewound: only exact prefixes resume
        self._warnings: list[str] = []
        self._wlock = threading.Lock()
        self.ram = RamTier(settings.ram_budget_mib * 2**20, chunked=settings.ram_chunks)
        self.read_bytes_s: dict[str, float] = {}  # measured restore rate per tier (the last one)
        self.disk = (
            DiskTier(root, fingerprint, state_layout(ctx), int(settings.disk_budget_gib * 2**30), self._warn)
            if settings.disk_budget_gib > 0
            else None
        )
        if self._disk_cuts_chunks():
            assert self.disk is not None
            self.disk.on_chunked = self.ram.adopt  # cut once, in the writer thread, for both tiers

    def _disk_cuts_chunks(self) -> bool:
        return self.disk is not None and self.disk.available and self.disk.chunked and self.ram.chunked

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
        """The saved state covering the longest usable prefix of `tokens`.

        Ties are broken as inside a tier (`preference`: the smaller state, then fewer saved
        tokens), except that between two states of the same size RAM wins over disk (no file to
        read and checksum) before the names are compared: never by the order of a listing."""
        n_ram, ram = self.ram.best(tokens, exact=self.exact)
        n_disk, disk = self.disk.best(tokens, exact=self.exact) if self.disk else (0, None)
        ranked = []
        if ram is not None:
            ranked.append(
                (_rank(n_ram, len(ram.state), 0, ram.tokens, ram.key), Candidate(n_ram, "ram", ram))
            )
        if disk is not None:
            ranked.append(
                (
                    _rank(n_disk, disk.header.payload_bytes, 1, disk.tokens, disk.path.stem),
                    Candidate(n_disk, "disk", disk),
                )
            )
        return min(ranked, key=lambda r: r[0])[1] if ranked else None

    def restore(self, ctx: LlamaContext, cand: Candidate) -> Restored | None:
        """Load a candidate into the context (then truncate to the usable prefix on attention
        models). None, with a warning, if it fails: the context is then empty."""
        t0 = time.perf_counter()
        if isinstance(cand.entry, RamEntry):
            ok = ctx.set_state(cand.entry.contiguous())
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
        seconds = time.perf_counter() - t0
        if seconds > 0:
            self.read_bytes_s[cand.source] = state_bytes(cand) / seconds
        n_saved = len(cand.entry.tokens)
        if cand.n_tokens < n_saved and not ctx.truncate(cand.n_tokens):
            ctx.clear()
            self._warn("could not truncate a restored checkpoint; falling back to cold")
            return None
        return Restored(cand.n_tokens, cand.source, time.perf_counter() - t0)

    def restore_estimate_s(self, cand: Candidate) -> float:
        """What restoring `cand` should take: its bytes at the rate its tier last restored at
        (`DEFAULT_READ_BYTES_S` until one was timed)."""
        rate = self.read_bytes_s.get(cand.source) or DEFAULT_READ_BYTES_S[cand.source]
        return state_bytes(cand) / rate

    # -- saving ---------------------------------------------------------------------------------

    def save(self, ctx: LlamaContext, tokens: list[int]) -> tuple[int, int]:
        """Snapshot the context (which holds exactly `tokens`) into RAM and (queued) disk.
        Returns (tokens, bytes) of the snapshot, or (0, 0) if it was already saved."""
        arr = np.asarray(tokens, dtype=np.int32)
        key = cf.tokens_digest(arr)[:32]
        if key in self.ram.entries or (self.disk and (key in self.disk.entries or self.disk.is_pending(key))):
            self.ram.touch(key)
            return 0, 0
        state = ctx.get_state()
        self.keep(key, arr, state)
        return len(arr), len(state)

    def keep(self, key: str, tokens: np.ndarray, state: np.ndarray) -> None:
        """Put a snapshot in the RAM tier and queue it for the disk: one array for both. Its
        chunks replace the RAM entry later, off this thread: cut by the disk writer when it
        writes chunks, else by the RAM tier's own thread."""
        self._make_room(len(state))
        kept = self.ram.put(key, tokens, state)
        queued = self.disk.save(key, tokens, state) if self.disk is not None else False
        if kept and not (queued and self._disk_cuts_chunks()):
            self.ram.compact_later(key)

    def held_bytes(self) -> int:
        """Bytes of state held in memory: RAM entries (whole ones, and every pooled chunk
        once) and unfinished disk writes, each array once (a whole RAM entry and its queued
        write are the same array)."""
        pending = self.disk.pending() if self.disk else []
        return self.ram.used + sum(p.nbytes for p in pending if not self.ram.holds_whole(p.name))

    def settle(self, timeout: float | None = None) -> bool:
        """Wait for the disk writes and the RAM tier's chunking (benchmarks, tests)."""
        return self.flush(timeout) and self.ram.settle(timeout)

    def _make_room(self, incoming: int) -> None:
        """Free memory until `incoming` more bytes fit in the RAM budget with everything held.

        First the least recently used RAM entries that no unfinished write shares (dropping
        one that does would free nothing: the write still holds its array). Then the oldest
        writes still waiting for the disk, together with their RAM entries: newer states cover
        more of the conversation and the newest is what the next turn or a restart resumes
        from, so when the disk cannot keep up it is the old ones that are not worth the memory.
        The write in progress is never interrupted and the incoming state is always kept (in
        RAM if it fits, queued for the disk in any case), so memory goes past the budget by at
        most those two states, e.g. when a single state is larger than the whole budget."""
        budget = self.ram.budget
        if self.held_bytes() + incoming <= budget:
            return
        pending = self.disk.pending() if self.disk else []
        unfinished = {p.name for p in pending}
        for key in list(self.ram.entries):  # least recently used first
            if key not in unfinished:
                self.ram.drop(key)
                if self.held_bytes() + incoming <= budget:
                    return
        for p in pending:
            assert self.disk is not None  # pending writes come from the disk tier
            if p.started or not self.disk.drop_waiting(p.name):
                continue
            self.ram.drop(p.name)
            self._warn(
                f"a checkpoint of {p.n_tokens:,} tokens ({p.nbytes / 2**20:,.0f} MiB) "
                "was dropped before it reached the disk: the disk is slower than the "
                f"saves and the states waiting for it would pass the RAM budget "
                f"({budget / 2**20:,.0f} MiB)"
            )
            if self.held_bytes() + incoming <= budget:
                return

    def flush(self, timeout: float | None = None) -> bool:
        return self.disk.flush(timeout) if self.disk else True

    def close(self, timeout: float | None = None) -> bool:
        """Finish queued disk writes within `timeout` seconds (default: the profile's
        `close_timeout_s`), abandoning the rest; True if all were written."""
        self.ram.close()
        if self.disk is None:
            return True
        return self.disk.close(self.settings.close_timeout_s if timeout is None else timeout)
