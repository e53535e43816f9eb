"""The disk tier of prefix checkpoints, an LRU under its byte budget (the RAM tier, and how a
candidate is chosen, are `ram_tier.py`).

A checkpoint is a token prefix plus the sequence state after exactly those tokens. The engine
asks each tier for the entry that covers the longest usable prefix of a new turn's tokens; on a
hybrid/recurrent model only an exact prefix is usable (the state cannot be rewound), on an
attention-only model any common prefix is (restore, then truncate with seq_rm).

The disk tier keeps an in-memory index (header + tokens of every file, read once when the tier
opens), writes in a background thread so a save never delays the first token, evicts the least
recently used files *before* writing so its budget is never exceeded, and deletes (with a warning)
any file that fails a check. Its directory is per model fingerprint and state layout, so
checkpoints of other models or other KV settings are never even candidates.

A write waiting for the writer thread holds the state array itself (the same array as the RAM
tier's entry, never a copy). How much memory such writes may hold is decided by `Checkpoints`,
which sees both tiers: this tier only offers `pending()` and `drop_waiting()`.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import chunks as ch
from . import file_format as cf
from .chunked_read import ChunkedPayload
from .ram_tier import preference, usable_prefix
from ..config import locations

log = logging.getLogger(__name__)

ABANDON_GRACE_S = 5.0
"""How long close() waits for an abandoned write to notice and stop (one chunk: well under a
second on any disk that still works)."""


BACKGROUND_NICE = 19
"""The disk writer thread's nice value: below the decode's threads, which it would otherwise
share the cores with while a reply streams."""


def background_priority() -> None:
    """Lower the calling thread's CPU priority (Linux sets nice per thread; elsewhere the call
    would name a process, so nothing is done). Raising one's own nice value needs no privilege."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except OSError as exc:  # a sandbox that forbids it: the writer runs at normal priority
        log.debug("checkpoint writer: cannot lower its priority (%s)", exc)


@dataclass
class DiskEntry:
    path: Path
    tokens: np.ndarray
    header: cf.CheckpointHeader
    payload_offset: int
    size: int
    table: np.ndarray | None = None  # format 3: its chunks (`cf.TABLE_ENTRY`); None: format 2


CHUNKED = True
"""Whether the disk tier writes format 3 (chunks shared between saves) or format 2 (one file
with the whole state); both are always read."""


@dataclass
class _Job:
    name: str
    tokens: np.ndarray
    payload: np.ndarray | ch.ChunkedState
    whole: np.ndarray | None = None  # the state as one array, when the payload is its chunks


@dataclass(frozen=True)
class PendingWrite:
    """A write not finished yet: waiting for the writer thread, or being written (`started`)."""

    name: str
    n_tokens: int
    nbytes: int
    started: bool


@dataclass(frozen=True)
class WriteReport:
    """What the last write put on disk: the state's size and the bytes written for it (a
    format-3 save writes only the chunks no pack held yet, plus its small table)."""

    name: str
    state_bytes: int
    written_bytes: int


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


def _pack_id(path: Path) -> bytes:
    """The id a pack's name gives (b"" for a name that is not a pack's)."""
    try:
        return bytes.fromhex(path.stem.partition("-")[0])
    except ValueError:
        return b""


def _packs_listed_in(directory: Path) -> set[bytes]:
    """The packs the readable format-3 checkpoints of another model's directory list."""
    packs: set[bytes] = set()
    for path in directory.glob(f"*{cf.SUFFIX}"):
        try:
            header, _, offset = cf.read_header(path)
            if header.n_chunks:
                packs.update(cf.packs_of(cf.read_chunk_table(path, header, offset)))
        except (cf.CheckpointInvalid, OSError):
            continue
    return packs


class DiskTier:
    """Checkpoint files under `root/<fingerprint>-<layout>/`; `root`'s total size is the
    budget (shared by every model)."""

    def __init__(
        self,
        root: Path,
        fingerprint: str,
        layout: dict[str, Any],
        budget_bytes: int,
        warn: Callable[[str], None],
        *,
        chunked: bool | None = None,
    ) -> None:
        self.root = root
        self.chunked = CHUNKED if chunked is None else chunked
        self._chunks: dict[bytes, tuple[bytes, int, int]] = {}  # digest -> (pack, offset, length)
        self.last_write: WriteReport | None = None
        self.on_chunked: Callable[[str, ch.ChunkedState], object] | None = None
        """Called from the writer thread with each state it has cut into chunks, once its write
        has ended (the RAM tier keeps the same chunks instead of the whole state; before, the
        writer holds the whole array anyway)."""
        self.fingerprint = fingerprint
        self.layout = layout
        self.budget = budget_bytes
        self.warn = warn
        self.dir = root / f"{fingerprint[:16]}-{layout_key(layout)}"
        self.entries: dict[str, DiskEntry] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a write started, ended or was dropped
        self._waiting: collections.OrderedDict[str, _Job] = collections.OrderedDict()  # oldest 1st
        self._current: _Job | None = None  # being written
        self._closing = False
        self._abandon = threading.Event()  # close() ran out of time: stop the write in progress
        self._writer: threading.Thread | None = None
        self.available = True
        try:
            locations.private_dir(self.dir)  # 0700 whatever the umask, like every folder of ours
            self._clean_temp_files()
            self._scan()
            self._collect_packs(self.dir, self._referenced_packs())
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
                table = cf.read_chunk_table(path, header, offset) if header.n_chunks else None
            except cf.CheckpointInvalid as exc:
                self.discard(path, str(exc))
                continue
            except OSError as exc:
                log.warning("cannot read checkpoint %s: %s", path, exc)
                continue
            self.entries[path.stem] = DiskEntry(path, tokens, header, offset, path.stat().st_size, table)
        self._reindex()

    def _reindex(self) -> None:
        """Rebuild the digest -> location index of the chunks the kept checkpoints list (what
        a new save may share instead of writing)."""
        index: dict[bytes, tuple[bytes, int, int]] = {}
        for entry in self.entries.values():
            if entry.table is not None:
                for d, pack, off, n in zip(
                    cf.digests_of(entry.table),
                    cf.packs_of(entry.table),
                    entry.table["offset"].tolist(),
                    entry.table["length"].tolist(),
                    strict=True,
                ):
                    index.setdefault(d, (pack, off, n))
        self._chunks = index

    def _referenced_packs(self, extra: set[bytes] = frozenset()) -> set[bytes]:  # type: ignore[assignment]
        packs = set(extra)
        for entry in list(self.entries.values()):
            if entry.table is not None:
                packs.update(cf.packs_of(entry.table))
        return packs

    def _collect_packs(self, directory: Path, referenced: set[bytes]) -> int:
        """Delete the packs of `directory` no kept checkpoint lists (orphans of a killed or
        abandoned write, or of evicted checkpoints); bytes freed. A pack a live process other
        than this one wrote is left alone: its checkpoint may be on its way."""
        freed = 0
        for path in directory.glob(f"*{cf.PACK_SUFFIX}"):
            pack_id, _, pid = path.stem.partition("-")
            try:
                pack = bytes.fromhex(pack_id)
                writer = int(pid)
            except ValueError:
                pack, writer = b"", 0
            if pack in referenced or (writer != os.getpid() and writer > 0 and _pid_alive(writer)):
                continue
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            freed += size
            log.info("removed chunk pack %s (no checkpoint needs it)", path.name)
        return freed

    def _check_identity(self, header: cf.CheckpointHeader) -> None:
        if header.model_fingerprint != self.fingerprint:
            raise cf.CheckpointInvalid("it belongs to another model")
        if header.layout != self.layout:
            raise cf.CheckpointInvalid("it was saved with other context parameters")

    def discard(self, path: Path, why: str) -> None:
        """Delete a checkpoint that failed a check, with a warning."""
        self.warn(f"discarded checkpoint {path.name}: {why}")
        path.unlink(missing_ok=True)
        if self.entries.pop(path.stem, None) is not None:
            self._reindex()

    def _discard_damaged(self, entry: DiskEntry, exc: cf.ChunkDamaged) -> None:
        """A chunk is damaged or gone: every checkpoint that lists it is unusable, and no new
        save may share it (the next save writes it again)."""
        for other in list(self.entries.values()):
            if other is not entry and other.table is not None and exc.digest in cf.digests_of(other.table):
                self.discard(other.path, f"it shares a damaged chunk ({exc})")
        self.discard(entry.path, str(exc))

    def best(self, tokens: np.ndarray, *, exact: bool) -> tuple[int, DiskEntry | None]:
        """The file covering the longest usable prefix of `tokens`, ties by `preference`."""
        best_key, best = None, None
        with self._lock:
            candidates = list(self.entries.values())
        for entry in candidates:
            n = usable_prefix(entry.tokens, tokens, exact=exact)
            if n == 0:
                continue
            key = preference(n, entry.header.payload_bytes, len(entry.tokens), entry.path.stem)
            if best_key is None or key < best_key:
                best_key, best = key, entry
        return (-best_key[0], best) if best_key is not None else (0, None)

    def open_payload(self, entry: DiskEntry) -> cf.MappedPayload | ChunkedPayload | None:
        """Re-check the file and map (format 2) or read (format 3) its verified payload; None
        (after a warning) if invalid."""
        try:
            header, tokens, offset = cf.read_header(entry.path)
            self._check_identity(header)
            if not np.array_equal(tokens, entry.tokens):
                raise cf.CheckpointInvalid("its tokens changed on disk")
            payload: cf.MappedPayload | ChunkedPayload
            if header.n_chunks:
                table = cf.read_chunk_table(entry.path, header, offset)
                payload = ChunkedPayload(
                    self.dir, table, header.payload_bytes, state_sha256=header.state_sha256
                )
            else:
                payload = cf.MappedPayload(entry.path, offset, header.payload_bytes, header.payload_sha256)
        except cf.ChunkDamaged as exc:
            with self._lock:
                self._discard_damaged(entry, exc)
            return None
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

    def save(self, name: str, tokens: np.ndarray, state: np.ndarray) -> bool:
        """Queue a write (returns at once); False if it is not queued (closing, unavailable, or
        that state is saved or queued already). Budget and I/O problems become warnings."""
        with self._lock:
            if (
                not self.available
                or self._closing
                or name in self.entries
                or name in self._waiting
                or (self._current is not None and self._current.name == name)
            ):
                return False
            self._waiting[name] = _Job(name, tokens, state)
            self._changed.notify_all()
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, name="velo-ckpt-writer", daemon=True)
                self._writer.start()
            return True

    def pending(self) -> list[PendingWrite]:
        """Writes not finished yet: the one being written first, then the waiting ones, oldest
        first."""
        with self._lock:
            jobs = [(self._current, True)] if self._current is not None else []
            jobs += [(job, False) for job in self._waiting.values()]
            return [PendingWrite(j.name, len(j.tokens), len(j.payload), started) for j, started in jobs]

    def is_pending(self, name: str) -> bool:
        with self._lock:
            return name in self._waiting or (self._current is not None and self._current.name == name)

    def drop_waiting(self, name: str) -> bool:
        """Forget a write that has not started (its state array is released); False if it
        has started or is done."""
        with self._lock:
            job = self._waiting.pop(name, None)
            if job is not None:
                self._changed.notify_all()
            return job is not None

    def _write_loop(self) -> None:
        background_priority()
        while True:
            with self._lock:
                while not self._waiting and not self._closing:
                    self._changed.wait()
                if not self._waiting or self._abandon.is_set():
                    return
                job = next(iter(self._waiting.values()))
            # Chunked while it still waits (the lock is not held: a save can queue, or drop
            # it, meanwhile): the writer then starts on a job that has all it needs.
            prepared = self._prepare(job)
            with self._lock:
                if self._waiting.get(job.name) is not job:
                    continue  # dropped while it was chunked
                del self._waiting[job.name]
                job = prepared
                self._current = job
            try:
                self._write(job)
            except cf.WriteAbandoned:
                log.warning(
                    "abandoned the checkpoint write of %d tokens (the engine closed)", len(job.tokens)
                )
            except Exception as exc:  # a write must never take the engine down
                log.exception("checkpoint write failed")
                self.warn(f"could not save checkpoint: {exc}")
            finally:
                self._hand_over(job)  # after the write: until then the writer holds the array
                with self._lock:
                    self._current = None
                    self._changed.notify_all()
            del job  # release the state now, not when the next job arrives

    def _hand_over(self, job: _Job) -> None:
        """Give `on_chunked` the chunks just cut; its failure costs memory, never the write."""
        if self.on_chunked is None or self._closing or not isinstance(job.payload, ch.ChunkedState):
            return
        try:
            self.on_chunked(job.name, job.payload)
        except Exception:
            log.exception("could not hand a chunked state to the RAM tier")

    def _prepare(self, job: _Job) -> _Job:
        """The job with its state cut into chunks (format 3), views of its own array."""
        if not self.chunked or isinstance(job.payload, ch.ChunkedState):
            return job
        return _Job(job.name, job.tokens, ch.split(job.payload), whole=job.payload)

    def _should_stop(self) -> bool:
        """Asked between the chunks of a write: True once close() has given up waiting."""
        return self._abandon.is_set()

    def _write(self, job: _Job) -> None:
        # Hashing runs here, in the writer thread (hashlib releases the GIL), not on the
        # engine's thread before the first token; on one core, at the writer's low priority: a
        # write usually overlaps the next decode, and hashing on every core beside it takes
        # cores from that decode on a small machine. Verifying at restore, on the way to
        # the first token, still hashes on every core.
        if self.chunked:
            self._write_chunked(job)
            return
        header = cf.CheckpointHeader(
            model_fingerprint=self.fingerprint,
            layout=self.layout,
            n_tokens=len(job.tokens),
            tokens_sha256=cf.tokens_digest(job.tokens),
            payload_bytes=len(job.payload),
            payload_sha256=cf.payload_digest(job.payload, threads=1),
        )
        need = cf.file_size_for(header.n_tokens, header.payload_bytes, len(header.to_json()))
        if not self._room_for(header, need, set()):
            return
        try:
            path = cf.write_checkpoint(
                self.dir, job.name, header, job.tokens, job.payload, should_stop=self._should_stop
            )
        except OSError as exc:
            self.warn(f"could not save checkpoint to {self.dir}: {exc.strerror or exc}")
            return
        size = path.stat().st_size
        with self._lock:
            self.entries[job.name] = DiskEntry(path, job.tokens, header, size - header.payload_bytes, size)
        self.last_write = WriteReport(job.name, header.payload_bytes, size)

    def _plan(self, state: ch.ChunkedState, *, share: bool = True) -> cf.ChunkedWrite:
        """The chunks to write (those no kept checkpoint lists, each once; all of them when not
        `share`) and the table."""
        pack = os.urandom(16)
        rows, pieces, offset = [], [], 0
        placed: dict[bytes, tuple[bytes, int, int]] = {}
        with self._lock:
            known = dict(self._chunks) if share else {}
        for d, chunk in zip(state.digests, state.chunks, strict=True):
            where = known.get(d) or placed.get(d)
            if where is None:
                where = placed[d] = (pack, offset, len(chunk))
                pieces.append(chunk)
                offset += len(chunk)
            rows.append((d, *where))
        table = np.array(rows, dtype=cf.TABLE_ENTRY)
        path = self.dir / f"{pack.hex()}-{os.getpid()}{cf.PACK_SUFFIX}"
        return cf.ChunkedWrite(path if pieces else None, pieces, table, len(state))

    def _write_chunked(self, job: _Job) -> None:
        if isinstance(job.payload, ch.ChunkedState):
            state, whole = job.payload, job.whole
        else:
            state, whole = ch.split(job.payload), job.payload
        # the whole state's digest too: a restore checks it in 16 MiB blocks on every core,
        # much faster than a digest per chunk (those name a damaged chunk when it fails)
        state_sha256 = cf.payload_digest(whole, threads=1) if whole is not None else ""
        plan = self._plan(state)
        if plan.new_bytes < len(state) and not self._fits_sharing(plan, state):
            plan = self._plan(state, share=False)  # the old packs can go: start a new one
        header = cf.CheckpointHeader(
            model_fingerprint=self.fingerprint,
            layout=self.layout,
            n_tokens=len(job.tokens),
            tokens_sha256=cf.tokens_digest(job.tokens),
            payload_bytes=len(state),
            payload_sha256=cf.table_digest(plan.table),
            n_chunks=len(plan.table),
            state_sha256=state_sha256,
        )
        manifest = cf.file_size_for(
            header.n_tokens, cf.TABLE_ENTRY.itemsize * header.n_chunks, len(header.to_json())
        )
        need = manifest + plan.new_bytes
        # a budget smaller than the whole state would evict what this one shares: say so
        if not self._room_for(
            header, max(need, manifest + header.payload_bytes), set(cf.packs_of(plan.table)), need
        ):
            return
        try:
            path = cf.write_checkpoint(
                self.dir, job.name, header, job.tokens, plan, should_stop=self._should_stop
            )
        except OSError as exc:
            self.warn(f"could not save checkpoint to {self.dir}: {exc.strerror or exc}")
            if plan.pack is not None:
                plan.pack.unlink(missing_ok=True)  # written, but its checkpoint is not
            return
        size = path.stat().st_size
        with self._lock:
            self.entries[job.name] = DiskEntry(
                path, job.tokens, header, size - plan.table.nbytes, size, plan.table
            )
            self._reindex()
        self.last_write = WriteReport(job.name, header.payload_bytes, size + plan.new_bytes)

    def _fits_sharing(self, plan: cf.ChunkedWrite, state: ch.ChunkedState) -> bool:
        """Whether the write fits the budget while keeping the packs it shares (those may hold
        chunks nobody needs any more, which only go with the whole pack)."""
        used = sum(
            f.stat().st_size
            for f in [*self.root.glob(f"*/*{cf.SUFFIX}"), *self.root.glob(f"*/*{cf.PACK_SUFFIX}")]
            if f.exists()
        )
        shared = set(cf.packs_of(plan.table))
        pinned = sum(f.stat().st_size for f in self.dir.glob(f"*{cf.PACK_SUFFIX}") if _pack_id(f) in shared)
        return used <= self.budget and pinned + plan.new_bytes + plan.table.nbytes + 4096 <= self.budget

    def _room_for(
        self, header: cf.CheckpointHeader, whole: int, keep_packs: set[bytes], need: int | None = None
    ) -> bool:
        """Make room for a write of `need` bytes (default `whole`); False (after a warning)
        when the state (`whole`: all of it on disk) is larger than the budget."""
        if whole > self.budget:
            self.warn(
                f"checkpoint of {header.n_tokens:,} tokens ({whole / 2**20:,.0f} MiB) "
                f"is larger than the disk budget ({self.budget / 2**20:,.0f} MiB); "
                "not saved to disk"
            )
            return False
        if self._should_stop():
            raise cf.WriteAbandoned
        if not self._evict_for(whole if need is None else need, keep_packs):
            # the packs it shares hold chunks no kept checkpoint needs any more, and are not
            # split: the budget is never passed, so this save is not written
            self.warn(
                f"checkpoint of {header.n_tokens:,} tokens not saved to disk: the chunks it "
                f"shares fill the disk budget ({self.budget / 2**20:,.0f} MiB)"
            )
            return False
        return True

    def _evict_for(self, need: int, keep_packs: set[bytes] = frozenset()) -> bool:  # type: ignore[assignment]
        """Delete least recently used checkpoints (any model) until `need` bytes fit. The budget
        counts what is on disk: checkpoint files and chunk packs; a pack goes only when no
        kept checkpoint lists a chunk of it (nor the write being made, `keep_packs`). False when
        even that leaves no room."""
        files = []
        used = 0
        for path in [*self.root.glob(f"*/*{cf.SUFFIX}"), *self.root.glob(f"*/*{cf.PACK_SUFFIX}")]:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            used += st.st_size
            if path.suffix == cf.SUFFIX:
                files.append((st.st_mtime, st.st_size, path))
        files.sort()
        while used + need > self.budget and files:
            _, size, path = files.pop(0)
            path.unlink(missing_ok=True)
            used -= size
            if path.parent == self.dir:
                with self._lock:
                    if self.entries.pop(path.stem, None) is not None:
                        self._reindex()
                used -= self._collect_packs(self.dir, self._referenced_packs(keep_packs))
            else:
                used -= self._collect_packs(path.parent, _packs_listed_in(path.parent))
            log.info("evicted checkpoint %s (%d bytes) for the disk budget", path, size)
        return used + need <= self.budget

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued writes; True if none is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._waiting or self._current is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def _unfinished_locked(self) -> tuple[int, float]:
        """(count, MiB) of the writes not finished; call with the lock held."""
        jobs = [*self._waiting.values()] + ([self._current] if self._current is not None else [])
        return len(jobs), sum(len(j.payload) for j in jobs) / 2**20

    def close(self, timeout: float | None = None, *, progress_every: float = 2.0) -> bool:
        """Finish the queued writes, waiting at most `timeout` seconds (None: as long as they
        take), logging what is left every `progress_every` seconds. Writes not finished by
        then are abandoned: the waiting ones are dropped and the one in progress stops at its
        next chunk, its temp file removed, so no partial checkpoint is ever left behind (a
        process killed meanwhile leaves a temp file the next start removes). True if every
        write made it to disk."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._closing = True
            self._changed.notify_all()
            next_report = time.monotonic() + progress_every
            while self._waiting or self._current is not None:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                if now >= next_report:
                    n, mib = self._unfinished_locked()
                    log.info(
                        "closing: waiting for %d checkpoint write(s), %.0f MiB, to reach the disk", n, mib
                    )
                    next_report = now + progress_every
                wake = next_report if deadline is None else min(next_report, deadline)
                self._changed.wait(max(0.0, wake - now))
            done = not self._waiting and self._current is None
            if not done:
                n, mib = self._unfinished_locked()
                log.warning(
                    "closing: abandoned %d checkpoint write(s), %.0f MiB, not written within %.0f s",
                    n,
                    mib,
                    timeout or 0,
                )
                self._waiting.clear()
                self._abandon.set()
            self._changed.notify_all()
            writer = self._writer
        if writer is not None:
            # The write in progress stops at its next chunk; don't hang on a stuck disk.
            writer.join(None if done else ABANDON_GRACE_S)
            if writer.is_alive():
                log.warning(
                    "closing: the checkpoint writer is still stuck in I/O; its temp "
                    "file is removed when it stops, or at the next start"
                )
        return done
