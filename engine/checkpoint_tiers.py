"""The RAM and disk tiers of prefix checkpoints, each an LRU under its own byte budget.

A checkpoint is a token prefix plus the sequence state after exactly those tokens. The engine
asks each tier for the entry that covers the longest usable prefix of a new turn's tokens; on a
hybrid/recurrent model only an exact prefix is usable (the state cannot be rewound), on an
attention-only model any common prefix is (restore, then truncate with seq_rm).

The disk tier keeps an in-memory index (header + tokens of every file, read once when the tier
opens), writes in a background thread so a save never delays the first token, evicts the least
recently used files *before* writing so its budget is never exceeded, and deletes (with a warning)
any file that fails a check. Its directory is per model fingerprint and state layout, so
checkpoints of other models or other KV settings are never even candidates.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import checkpoint_file as cf

log = logging.getLogger(__name__)


def usable_prefix(ckpt_tokens: np.ndarray, tokens: np.ndarray, *, exact: bool) -> int:
    """How many leading tokens of `tokens` a checkpoint can stand for (0 = none).

    At least one token of `tokens` must be left to decode (its logits start the reply)."""
    n = len(ckpt_tokens)
    limit = len(tokens) - 1
    if exact:
        if n == 0 or n > limit or not np.array_equal(ckpt_tokens, tokens[:n]):
            return 0
        return n
    m = min(n, limit)
    if m <= 0:
        return 0
    diff = np.flatnonzero(ckpt_tokens[:m] != tokens[:m])
    return int(diff[0]) if diff.size else m


@dataclass
class RamEntry:
    tokens: np.ndarray
    state: np.ndarray
    key: str


class RamTier:
    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.entries: collections.OrderedDict[str, RamEntry] = collections.OrderedDict()
        self.used = 0

    def put(self, key: str, tokens: np.ndarray, state: np.ndarray) -> bool:
        size = len(state)
        if size > self.budget:
            return False
        if key in self.entries:
            self.entries.move_to_end(key)
            return True
        while self.used + size > self.budget and self.entries:
            _, old = self.entries.popitem(last=False)
            self.used -= len(old.state)
        self.entries[key] = RamEntry(tokens, state, key)
        self.used += size
        return True

    def best(self, tokens: np.ndarray, *, exact: bool) -> tuple[int, RamEntry | None]:
        best_n, best = 0, None
        for entry in self.entries.values():
            n = usable_prefix(entry.tokens, tokens, exact=exact)
            if n > best_n:
                best_n, best = n, entry
        return best_n, best

    def touch(self, key: str) -> None:
        if key in self.entries:
            self.entries.move_to_end(key)

    def drop(self, key: str) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.used -= len(entry.state)


@dataclass
class DiskEntry:
    path: Path
    tokens: np.ndarray
    header: cf.CheckpointHeader
    payload_offset: int
    size: int


@dataclass
class _Job:
    name: str
    tokens: np.ndarray
    payload: np.ndarray
    done: threading.Event = field(default_factory=threading.Event)


def layout_key(layout: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()[:12]


_TEMP_NAME = re.compile(r"^\.[^.]+\.(\d+)\.")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DiskTier:
    """Checkpoint files under `root/<fingerprint>-<layout>/`; `root`'s total size is the
    budget (shared by every model)."""

    def __init__(self, root: Path, fingerprint: str, layout: dict[str, Any], budget_bytes: int,
                 warn: Callable[[str], None]) -> None:
        self.root = root
        self.fingerprint = fingerprint
        self.layout = layout
        self.budget = budget_bytes
        self.warn = warn
        self.dir = root / f"{fingerprint[:16]}-{layout_key(layout)}"
        self.entries: dict[str, DiskEntry] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._pending: dict[str, _Job] = {}
        self._writer: threading.Thread | None = None
        self.available = True
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._clean_temp_files()
            self._scan()
        except OSError as exc:
            self.available = False
            warn(f"checkpoint disk tier disabled: cannot use {self.dir} ({exc.strerror})")

    # -- index ----------------------------------------------------------------------------------

    def _clean_temp_files(self) -> None:
        """Remove temp files left by a process killed while writing (not a live writer's)."""
        for tmp in self.dir.glob(".*.tmp"):
            match = _TEMP_NAME.match(tmp.name)  # atomic_file's ".<stem>.<pid>.<random>.tmp"
            pid = int(match.group(1)) if match else None
            if pid is None or not _pid_alive(pid):
                tmp.unlink(missing_ok=True)
                log.info("removed a partial checkpoint %s", tmp.name)

    def _scan(self) -> None:
        for path in sorted(self.dir.glob(f"*{cf.SUFFIX}")):
            try:
                header, tokens, offset = cf.read_header(path)
                self._check_identity(header)
            except cf.CheckpointInvalid as exc:
                self.discard(path, str(exc))
                continue
            except OSError as exc:
                log.warning("cannot read checkpoint %s: %s", path, exc)
                continue
            self.entries[path.stem] = DiskEntry(path, tokens, header, offset,
                                                path.stat().st_size)

    def _check_identity(self, header: cf.CheckpointHeader) -> None:
        if header.model_fingerprint != self.fingerprint:
            raise cf.CheckpointInvalid("it belongs to another model")
        if header.layout != self.layout:
            raise cf.CheckpointInvalid("it was saved with other context parameters")

    def discard(self, path: Path, why: str) -> None:
        """Delete a checkpoint that failed a check, with a warning."""
        self.warn(f"discarded checkpoint {path.name}: {why}")
        path.unlink(missing_ok=True)
        self.entries.pop(path.stem, None)

    def best(self, tokens: np.ndarray, *, exact: bool) -> tuple[int, DiskEntry | None]:
        best_n, best = 0, None
        with self._lock:
            candidates = list(self.entries.values())
        for entry in candidates:
            n = usable_prefix(entry.tokens, tokens, exact=exact)
            if n > best_n:
                best_n, best = n, entry
        return best_n, best

    def open_payload(self, entry: DiskEntry) -> cf.MappedPayload | None:
        """Re-check the file and map its verified payload; None (after a warning) if invalid."""
        try:
            header, tokens, offset = cf.read_header(entry.path)
            self._check_identity(header)
            if not np.array_equal(tokens, entry.tokens):
                raise cf.CheckpointInvalid("its tokens changed on disk")
            payload = cf.MappedPayload(entry.path, offset, header.payload_bytes,
                                       header.payload_sha256)
        except cf.CheckpointInvalid as exc:
            with self._lock:
                self.discard(entry.path, str(exc))
            return None
        except OSError as exc:
            self.warn(f"cannot read checkpoint {entry.path.name}: {exc.strerror}")
            with self._lock:
                self.entries.pop(entry.path.stem, None)  # not deleted: it may be readable later
            return None
        try:
            os.utime(entry.path)  # LRU: most recently used
        except OSError:
            pass  # a read-only disk: the order is only a hint
        return payload

    # -- writing --------------------------------------------------------------------------------

    def save(self, name: str, tokens: np.ndarray, state: np.ndarray) -> None:
        """Queue a write (returns at once). Budget and I/O problems become warnings."""
        with self._lock:
            if not self.available or name in self.entries or name in self._pending:
                return
            job = _Job(name, tokens, state)
            self._pending[name] = job
        if self._writer is None or not self._writer.is_alive():
            self._writer = threading.Thread(target=self._write_loop, name="velo-ckpt-writer",
                                            daemon=True)
            self._writer.start()
        self._queue.put(job)

    def _write_loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._write(job)
            except Exception as exc:  # a write must never take the engine down
                log.exception("checkpoint write failed")
                self.warn(f"could not save checkpoint: {exc}")
            finally:
                with self._lock:
                    self._pending.pop(job.name, None)
                job.done.set()

    def _write(self, job: _Job) -> None:
        # Hashing runs here, in the writer thread (hashlib releases the GIL), not on the
        # engine's thread before the first token.
        header = cf.CheckpointHeader(
            model_fingerprint=self.fingerprint, layout=self.layout, n_tokens=len(job.tokens),
            tokens_sha256=cf.tokens_digest(job.tokens), payload_bytes=len(job.payload),
            payload_sha256=cf.payload_digest(job.payload),
        )
        need = cf.file_size_for(header.n_tokens, header.payload_bytes, len(header.to_json()))
        if need > self.budget:
            self.warn(f"checkpoint of {header.n_tokens:,} tokens ({need / 2**20:,.0f} MiB) "
                      f"is larger than the disk budget ({self.budget / 2**20:,.0f} MiB); "
                      "not saved to disk")
            return
        self._evict_for(need)
        try:
            path = cf.write_checkpoint(self.dir, job.name, header, job.tokens, job.payload)
        except OSError as exc:
            self.warn(f"could not save checkpoint to {self.dir}: {exc.strerror or exc}")
            return
        size = path.stat().st_size
        with self._lock:
            self.entries[job.name] = DiskEntry(path, job.tokens, header,
                                               size - header.payload_bytes, size)

    def _evict_for(self, need: int) -> None:
        """Delete least recently used checkpoint files (any model) until `need` bytes fit."""
        files = []
        for path in self.root.glob(f"*/*{cf.SUFFIX}"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, st.st_size, path))
        used = sum(size for _, size, _ in files)
        files.sort()
        while used + need > self.budget and files:
            _, size, path = files.pop(0)
            path.unlink(missing_ok=True)
            used -= size
            if path.parent == self.dir:
                with self._lock:
                    self.entries.pop(path.stem, None)
            log.info("evicted checkpoint %s (%d bytes) for the disk budget", path, size)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued writes; True if none is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            pending = list(self._pending.values())
        for job in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not job.done.wait(left):
                return False
        return True

    def close(self) -> None:
        self.flush()
        if self._writer is not None and self._writer.is_alive():
            self._queue.put(None)
            self._writer.join()
