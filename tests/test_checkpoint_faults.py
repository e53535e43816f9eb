"""Faults around checkpoints and the session store: each must leave every message in place,
never restore an invalid state, still answer (cold if it must) and say so in one warning."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from velo_chat.engine.checkpoints import file_format as cf
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.engine import Engine
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.events import EngineWarning, TurnDone
from velo_chat.engine.fit import machine

from tests.support.engine_helpers import run_cli, test_profile

Q = [ChatMessage("user", "Name two colours of the rainbow.")]
N = 16


@pytest.fixture(autouse=True, params=["chunked", "single"])
def fmt(request, monkeypatch) -> str:
    """Every fault on both formats the disk tier writes: format 3 (chunks in packs, a table per
    checkpoint) and format 2 (one file with the whole state). Child processes get it in argv."""
    from velo_chat.engine.checkpoints import tiers

    monkeypatch.setattr(tiers, "CHUNKED", request.param == "chunked")
    return request.param


def stored_bytes(root: Path) -> int:
    """Bytes on disk under `root`: checkpoint files and chunk packs."""
    return sum(f.stat().st_size for f in root.glob("*/*") if f.suffix in (cf.SUFFIX, cf.PACK_SUFFIX))


def profile(path: Path, **checkpoints):
    return test_profile(path, checkpoints={"interval_tokens": 0, **checkpoints})


def turn(engine: Engine, messages=Q):
    events = list(engine.turn(messages, max_tokens=N))
    done = events[-1]
    assert isinstance(done, TurnDone), done
    return done, [e.message for e in events if isinstance(e, EngineWarning)]


def seed_checkpoints(path: Path, root: Path) -> tuple[TurnDone, list[Path]]:
    """One turn on a fresh engine; returns it and the checkpoint files it wrote."""
    with Engine(profile(path), checkpoint_root=root) as engine:
        engine.load()
        done, warnings = turn(engine)
        assert warnings == []
    files = sorted(root.glob(f"*/*{cf.SUFFIX}"))
    assert len(files) == 2  # prefill end, reply boundary
    return done, files


def fresh_turn(path: Path, root: Path, messages=Q, **checkpoints):
    with Engine(profile(path, **checkpoints), checkpoint_root=root) as engine:
        engine.load()
        return turn(engine, messages)


def cold_text(path: Path, messages=Q) -> str:
    with Engine(profile(path, enabled=False)) as engine:
        engine.load()
        return turn(engine, messages)[0].text


@pytest.mark.parametrize("damage", ["flip_payload_byte", "truncate", "garbage_header"])
def test_damaged_checkpoints_are_discarded_and_the_turn_goes_cold(smollm2_path, tmp_path, damage):
    root = tmp_path / "ckpt"
    first, files = seed_checkpoints(smollm2_path, root)
    for f in files:
        data = bytearray(f.read_bytes())
        if damage == "flip_payload_byte":
            data[-100] ^= 0xFF
        elif damage == "truncate":
            data = data[: len(data) // 2]
        else:
            data[8:40] = b"\x07" * 32
        f.write_bytes(bytes(data))
    done, warnings = fresh_turn(smollm2_path, root)
    assert done.stats.source == "none" and done.stats.cached_tokens == 0
    assert len(warnings) >= 1 and all("discarded checkpoint" in w for w in warnings)
    # cold like the seed turn, whose prefill paused at the same save points: the same batches
    # (a prefill in other batches may move the logits' last bits on a GPU, `op_offload`
    # included, so the reply of a turn without checkpoints is compared on the CPU only)
    assert done.text == first.text
    if not machine.probe().gpu_offload:
        assert done.text == cold_text(smollm2_path)
    for f in files:
        # Deleted, or rewritten whole by this turn's own save (then it verifies).
        if f.exists():
            cf.read_header(f)


def test_one_bad_checkpoint_falls_back_to_the_next_best(smollm2_path, tmp_path, fmt):
    """A follow-up to the seeded turn: the reply-boundary file covers more of it than the
    prefill-end file, so it is the one best candidate whatever order the files are listed in.
    Damaged, it is discarded and the prefill-end file (the next best) is restored."""
    root = tmp_path / "ckpt"
    first, files = seed_checkpoints(smollm2_path, root)
    boundary, prefill_end = sorted(files, key=lambda f: -cf.read_header(f)[0].n_tokens)
    n_prefill_end = cf.read_header(prefill_end)[0].n_tokens
    assert n_prefill_end == first.stats.prompt_tokens - 1
    data = bytearray(boundary.read_bytes())
    data[-1] ^= 0x01
    boundary.write_bytes(bytes(data))
    convo = Q + [ChatMessage("assistant", first.text), ChatMessage("user", "And one more?")]
    done, warnings = fresh_turn(smollm2_path, root, convo)
    why = "chunk table" if fmt == "chunked" else "payload checksum mismatch"
    assert any(why in w for w in warnings), warnings
    assert done.stats.source == "disk"
    assert done.stats.cached_tokens == n_prefill_end


def test_checkpoints_of_another_model_or_layout_are_never_restored(smollm2_path, qwen_path, tmp_path):
    root = tmp_path / "ckpt"
    seed_checkpoints(smollm2_path, root)
    smol_dir = next(root.iterdir())
    # A qwen4exp engine looks in its own directory; plant SmolLM2's files there.
    with Engine(profile(qwen_path), checkpoint_root=root) as engine:
        engine.load()
        qwen_dir = engine._checkpoints.disk.dir
    for f in smol_dir.glob(f"*{cf.SUFFIX}"):
        shutil.copy(f, qwen_dir / f.name)
    done, warnings = fresh_turn(qwen_path, root)
    assert done.stats.source == "none"
    assert sum("belongs to another model" in w for w in warnings) == 2
    # Other context parameters (KV cache type): a separate directory, never a candidate.
    done, warnings = fresh_turn(smollm2_path, root)
    assert done.stats.source == "disk"
    other = test_profile(
        smollm2_path, context={"type_k": "f32", "type_v": "f32"}, checkpoints={"interval_tokens": 0}
    )
    with Engine(other, checkpoint_root=root) as engine:
        engine.load()
        f32_dir = engine._checkpoints.disk.dir
        done, warnings = turn(engine)
    assert done.stats.source == "none" and warnings == []
    assert f32_dir not in (smol_dir, qwen_dir)
    # ... and a file moved into the wrong layout's directory is caught by its header.
    for f in smol_dir.glob(f"*{cf.SUFFIX}"):
        shutil.copy(f, f32_dir / ("x" + f.name))
    with Engine(other, checkpoint_root=root) as engine:
        engine.load()
        _, warnings = turn(engine)
    assert sum("other context parameters" in w for w in warnings) == 2


def test_disk_budget_smaller_than_one_checkpoint(smollm2_path, tmp_path):
    root = tmp_path / "ckpt"
    with Engine(profile(smollm2_path, disk_budget_gib=0.0001), checkpoint_root=root) as engine:
        engine.load()
        done, _ = turn(engine)
        diagnostics(engine).flush_checkpoints()
        _, warnings = turn(engine)
    assert done.text
    assert any("larger than the disk budget" in w for w in warnings)
    assert list(root.glob(f"*/*{cf.SUFFIX}")) == []


def test_disk_budget_is_never_exceeded(smollm2_path, tmp_path):
    root = tmp_path / "ckpt"
    _, files = seed_checkpoints(smollm2_path, root)
    one = stored_bytes(root) / 2  # two checkpoints (and their packs)
    budget_gib = 2.5 * one / 2**30  # room for two files, not three
    with Engine(profile(smollm2_path, disk_budget_gib=budget_gib), checkpoint_root=root) as engine:
        engine.load()
        for i in range(3):
            turn(engine, [ChatMessage("user", f"Count to {i + 3}.")])
            diagnostics(engine).flush_checkpoints()
            assert stored_bytes(root) <= budget_gib * 2**30


def test_read_only_checkpoint_dir(smollm2_path, tmp_path):
    root = tmp_path / "ckpt"
    with Engine(profile(smollm2_path), checkpoint_root=root) as engine:
        engine.load()
        ckpt_dir = engine._checkpoints.disk.dir
    if subprocess.run(["chattr", "+i", str(ckpt_dir)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        with Engine(profile(smollm2_path), checkpoint_root=root) as engine:
            engine.load()
            done, _ = turn(engine)
            diagnostics(engine).flush_checkpoints()
            again, warnings = turn(engine, [ChatMessage("user", "Name a third colour.")])
        assert done.text and again.text
        assert any("could not save checkpoint" in w for w in warnings)
    finally:
        subprocess.run(["chattr", "-i", str(ckpt_dir)], check=True)


FULL_DISK_CHILD = r"""
import resource, signal, sys
from pathlib import Path
from velo_chat.engine.checkpoints import tiers
tiers.CHUNKED = sys.argv[3] == "chunked"
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.engine import Engine
from velo_chat.engine.events import EngineWarning, TurnDone
from tests.support.engine_helpers import test_profile
p = test_profile(Path(sys.argv[1]), checkpoints={"interval_tokens": 0})
with Engine(p, checkpoint_root=Path(sys.argv[2])) as e:
    e.load()
    # A full disk from here on, after the load: writes fail with EFBIG. (A GPU build's start
    # may write caches of its own, which this test is not about.)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    list(e.turn([ChatMessage("user", "Hi")], max_tokens=8))
    diagnostics(e).flush_checkpoints()
    events = list(e.turn([ChatMessage("user", "Hello")], max_tokens=8))
    assert isinstance(events[-1], TurnDone) and events[-1].text
    for ev in events:
        if isinstance(ev, EngineWarning):
            print("WARNING", ev.message)
"""


def test_full_disk(smollm2_path, tmp_path, fmt):
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(smollm2_path), str(tmp_path / "ckpt"), fmt],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "WARNING could not save checkpoint" in proc.stdout
    assert not list((tmp_path / "ckpt").glob(f"*/*{cf.SUFFIX}"))
    assert not list((tmp_path / "ckpt").glob(f"*/*{cf.PACK_SUFFIX}"))  # no pack without its table


KILL_WRITER_CHILD = r"""
import os, sys, threading
from pathlib import Path
import numpy as np
from velo_chat.engine.checkpoints import file_format as cf
from velo_chat.engine.checkpoints.tiers import DiskTier
cf.WRITE_CHUNK = 1 << 20
tier = DiskTier(Path(sys.argv[1]), "f" * 64, {"k": 1}, 2**34, print, chunked=sys.argv[2] == "chunked")
def stuck_once_writing():  # the writer stops for good between two chunks of the payload
    if list(tier.dir.glob(".*.tmp")) and os.path.getsize(next(tier.dir.glob(".*.tmp"))) > 1 << 20:
        print("mid-write", flush=True)
        threading.Event().wait()
    return False
tier._should_stop = stuck_once_writing
tier.save("small", np.arange(10, dtype=np.int32), np.ones(1 << 20, dtype=np.uint8))
tier.flush()
tier.save("big", np.arange(1000, dtype=np.int32), np.frombuffer(os.urandom(4 << 20), np.uint8))
threading.Event().wait()
"""


def test_sigkill_while_writing_a_checkpoint(tmp_path, fmt):
    """The child's writer is held between two chunks of a payload (no race with the kill):
    the next start removes the partial file and keeps the whole one."""
    from velo_chat.engine.checkpoints.tiers import DiskTier

    root = tmp_path / "ckpt"
    child = subprocess.Popen(
        [sys.executable, "-c", KILL_WRITER_CHILD, str(root), fmt],
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "mid-write"
        assert list(root.glob("*/.*.tmp")), "the writer should be mid-write"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    warnings: list[str] = []
    tier = DiskTier(root, "f" * 64, {"k": 1}, 2**34, warnings.append)
    assert not list(root.glob("*/.*.tmp"))  # the partial file is gone
    if fmt == "chunked":  # one pack: the whole checkpoint's; the killed one's never got its name
        assert len(list(root.glob(f"*/*{cf.PACK_SUFFIX}"))) == 1
    assert [e.path.stem for e in tier.entries.values()] == ["small"]  # the whole one is kept
    for entry in tier.entries.values():
        cf.read_header(entry.path)
        with tier.open_payload(entry) as payload:
            assert len(payload.view) == 1 << 20
    assert warnings == []
    tier.close()


def test_sigkill_while_generating_keeps_the_messages(velo_home):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "velo_chat.app.cli",
            "ask",
            "Write a long story about a cat.",
            "--max-tokens",
            "2000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
        cwd=Path(__file__).parent.parent,
    )
    db = velo_home / "data" / "sessions.sqlite3"
    try:
        # Kill it once part of the reply has reached the store (it is flushed about once a
        # second while it streams): waiting for that, not for a fixed time, holds on any machine.
        deadline = time.monotonic() + 240
        while not _reply_stored(db) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the reply ended before part of it was stored"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT role, status, content FROM messages ORDER BY position").fetchall()
        sid = conn.execute("SELECT id FROM sessions").fetchone()[0]
    assert rows[0] == ("user", "complete", "Write a long story about a cat.")
    assert rows[1][0:2] == ("assistant", "interrupted") and len(rows[1][2]) > 0
    again = run_cli("ask", "Give it a title.", "--session", sid, "--max-tokens", "8", "--json")
    assert again.returncode == 0, again.stderr


def _reply_stored(db: Path) -> bool:
    if not db.exists():
        return False
    try:
        with closing(sqlite3.connect(db, timeout=1)) as conn:
            row = conn.execute(
                "SELECT length(content) FROM messages WHERE role = 'assistant' ORDER BY position DESC LIMIT 1"
            ).fetchone()
    except sqlite3.Error:  # not created yet, or busy
        return False
    return bool(row and row[0])


LOCK_CHILD = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(30)
"""


def test_database_locked_by_another_process(velo_home):
    first = run_cli("ask", "Hello!", "--max-tokens", "4", "--json")
    assert first.returncode == 0, first.stderr
    db = velo_home / "data" / "sessions.sqlite3"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_CHILD, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        proc = run_cli("ask", "Are you there?", "--max-tokens", "4")
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "locked" in proc.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2


def test_a_live_writers_temp_file_is_left_alone(tmp_path):
    """Opening the disk tier cleans up after dead writers only: another engine (this process
    or another) may be writing right now."""
    from velo_chat.engine.checkpoints.tiers import DiskTier

    root = tmp_path / "ckpt"
    tier = DiskTier(root, "f" * 64, {"k": 1}, 2**30, print)
    live = tier.dir / f".abc.{os.getpid()}.x1y2.tmp"
    dead = tier.dir / ".abc.999999999.x1y2.tmp"
    odd = tier.dir / ".junk.tmp"
    for f in (live, dead, odd):
        f.write_bytes(b"partial")
    tier.close()
    DiskTier(root, "f" * 64, {"k": 1}, 2**30, print).close()
    assert live.exists() and not dead.exists() and not odd.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nice is per thread on Linux only")
def test_the_disk_writer_hashes_on_one_core_at_low_priority(tmp_path: Path, monkeypatch, fmt):
    """A disk write usually overlaps the next reply's decode: its hashing must not take every
    core from it (one hashing thread, the writer thread at nice 19), while the engine's own
    thread keeps its priority."""
    import numpy as np

    from velo_chat.engine.checkpoints import tiers as checkpoint_tiers

    seen: list[tuple[int | None, int]] = []
    real = cf.payload_digest

    def spy(data, threads=None):
        seen.append((threads, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return real(data, threads)

    monkeypatch.setattr(cf, "payload_digest", spy)
    real_split = checkpoint_tiers.ch.split

    def split_spy(data, pool=None):  # format 3 hashes its chunks one by one, in this thread,
        # then the whole state (the digest a restore checks first)
        seen.append((1, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return real_split(data, pool)

    monkeypatch.setattr(checkpoint_tiers.ch, "split", split_spy)
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    tier = checkpoint_tiers.DiskTier(tmp_path, "f" * 64, {"k": 1}, 2**30, print)
    tier.save("one", np.arange(8, dtype=np.int32), np.zeros(1 << 20, dtype=np.uint8))
    assert tier.flush(timeout=30)
    tier.close()
    assert seen == [(1, checkpoint_tiers.BACKGROUND_NICE)] * (2 if fmt == "chunked" else 1)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    again = checkpoint_tiers.DiskTier(tmp_path, "f" * 64, {"k": 1}, 2**30, print)
    assert [e.path.stem for e in again.entries.values()] == ["one"]  # written whole
    again.close()
