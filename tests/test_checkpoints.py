"""The checkpoint tiers and files on their own: which checkpoint wins a tie, how much memory
queued disk writes may hold, closing with writes still queued, and headers that lie about their
size. Real files in tmp_path and, where a context is needed, the real SmolLM2 one."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from velo_chat.engine.checkpoints import file_format as cf
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.checkpoints.ram_tier import RamTier
from velo_chat.engine.checkpoints.tiers import DiskTier
from velo_chat.engine.checkpoints.manager import Checkpoints
from velo_chat.engine.config.profile_schema import CheckpointSettings
from velo_chat.engine.diagnostics import diagnostics

FP = "f" * 64
LAYOUT = {"k": 1}
PROMPT = np.arange(1000, 1037, dtype=np.int32)  # 37 tokens


def ckpt_tokens(n: int, *, diverge_at: int | None = None) -> np.ndarray:
    """`n` tokens that start like PROMPT (and go on past it), optionally differing at one."""
    toks = np.arange(1000, 1000 + n, dtype=np.int32)
    if diverge_at is not None:
        toks[diverge_at] = -5
    return toks


def state(nbytes: int, fill: int = 1) -> np.ndarray:
    return np.full(nbytes, fill, dtype=np.uint8)


# (name, tokens, state bytes): the 36-token and the 58-token states both give 36 usable tokens
# of the 37-token prompt on an attention model; "big" also ties but is larger.
TIED = [
    ("b" * 32, ckpt_tokens(58), 5800),
    ("a" * 32, ckpt_tokens(36), 3600),
    ("c" * 32, ckpt_tokens(40), 9000),
    ("d" * 32, ckpt_tokens(30), 100),  # fewer usable tokens: never the best here
]


@pytest.mark.parametrize("order", list(itertools.permutations(range(len(TIED)))))
def test_ram_tier_ties_pick_the_smaller_state_in_any_order(order):
    ram = RamTier(1 << 20)
    for i in order:
        name, toks, nbytes = TIED[i]
        ram.put(name, toks, state(nbytes))
    n, best = ram.best(PROMPT, exact=False)
    assert (n, best.key) == (36, "a" * 32)


def test_ties_of_equal_size_go_to_fewer_tokens_then_the_name():
    for names in (("x" * 32, "y" * 32), ("y" * 32, "x" * 32)):
        ram = RamTier(1 << 20)
        ram.put(names[0], ckpt_tokens(50), state(100))
        ram.put(names[1], ckpt_tokens(50, diverge_at=45), state(100))
        ram.put("w" * 32, ckpt_tokens(60), state(100))
        n, best = ram.best(PROMPT, exact=False)
        assert (n, best.key) == (36, "x" * 32)  # 50 tokens < 60; then "x" < "y"


def test_exact_prefixes_on_hybrid_models_have_no_ties_to_break():
    ram = RamTier(1 << 20)
    for name, toks, nbytes in TIED:
        ram.put(name, toks, state(nbytes))
    n, best = ram.best(PROMPT, exact=True)
    assert (n, best.key) == (36, "a" * 32)  # the 58- and 40-token states are not prefixes


def _disk_tier(root: Path, warnings: list[str] | None = None) -> DiskTier:
    return DiskTier(root, FP, LAYOUT, 2**30, (warnings if warnings is not None else []).append)


def test_disk_tier_ties_pick_the_smaller_state_in_any_order(tmp_path):
    tier = _disk_tier(tmp_path)
    for name, toks, nbytes in TIED:
        tier.save(name, toks, state(nbytes))
    assert tier.flush(30)
    tier.close()
    tier = _disk_tier(tmp_path)
    entries = list(tier.entries.items())
    for order in itertools.permutations(entries):
        tier.entries = dict(order)
        n, best = tier.best(PROMPT, exact=False)
        assert (n, best.path.stem) == (36, "a" * 32)
    tier.close()


def test_find_prefers_the_smaller_state_across_tiers_and_ram_on_equal_size(smol_engine, tmp_path):
    settings = CheckpointSettings(ram_budget_mib=16, disk_budget_gib=1.0)
    ck = Checkpoints(settings, fingerprint=FP, ctx=smol_engine._ctx, hybrid=False, root=tmp_path)
    try:
        ck.ram.put("b" * 32, ckpt_tokens(58), state(5800))
        ck.disk.save("a" * 32, ckpt_tokens(36), state(3600))
        assert ck.flush(30)
        cand = ck.find(PROMPT)
        assert (cand.n_tokens, cand.source) == (36, "disk")  # smaller, though on disk
        ck.ram.put("a" * 32, ckpt_tokens(36), state(3600))
        cand = ck.find(PROMPT)
        assert (cand.n_tokens, cand.source) == (36, "ram")  # the same state: RAM is cheaper
        cand = ck.find(ckpt_tokens(70))  # all 58 tokens usable: more tokens beat a smaller state
        assert (cand.n_tokens, cand.entry.key) == (58, "b" * 32)
    finally:
        ck.close()


# -- headers that lie about the file's size ---------------------------------------------------


def _crafted(
    path: Path, *, n_tokens: int, payload_bytes: int, real_tokens: int = 4, real_payload: int = 64
) -> Path:
    """A checkpoint file whose header claims `n_tokens` / `payload_bytes` but holds fewer."""
    toks = np.arange(real_tokens, dtype=np.int32)
    header = cf.CheckpointHeader(
        FP, LAYOUT, n_tokens, cf.tokens_digest(toks), payload_bytes, "sha256-16MiB:" + "0" * 64
    )
    raw = header.to_json()
    path.write_bytes(
        cf._FIXED.pack(cf.MAGIC, cf.FORMAT_VERSION, len(raw))
        + raw
        + toks.astype("<i4").tobytes()
        + bytes(real_payload)
    )
    return path


@pytest.mark.parametrize(
    ("n_tokens", "payload_bytes", "why"),
    [
        (2**50, 64, "token count"),  # would ask for a 4 PiB read before the fix
        (4, 2**50, "payload"),
        (-3, 64, "token count"),
        (4, -64, "payload"),
    ],
)
def test_a_header_is_checked_against_the_file_size_before_reading(tmp_path, n_tokens, payload_bytes, why):
    path = _crafted(tmp_path / f"x{cf.SUFFIX}", n_tokens=n_tokens, payload_bytes=payload_bytes)
    with pytest.raises(cf.CheckpointInvalid, match=why):
        cf.read_header(path)


def test_the_disk_tier_discards_a_file_whose_header_lies(tmp_path):
    warnings: list[str] = []
    tier = _disk_tier(tmp_path, warnings)
    bad = _crafted(tier.dir / f"{'a' * 32}{cf.SUFFIX}", n_tokens=2**50, payload_bytes=64)
    tier.close()
    tier = _disk_tier(tmp_path, warnings)
    tier.close()
    assert tier.entries == {} and not bad.exists()
    assert len(warnings) == 1 and "discarded checkpoint" in warnings[0]


# -- memory held by writes waiting for the disk ------------------------------------------------


@pytest.fixture
def held_writes(monkeypatch):
    """Hold every checkpoint write at its start until the returned event is set: a disk that
    cannot keep up, without timing."""
    gate = threading.Event()
    real = cf.write_checkpoint

    def gated(*args, **kwargs):
        gate.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(cf, "write_checkpoint", gated)
    yield gate
    gate.set()


def _traced() -> int:
    return tracemalloc.get_traced_memory()[0]


def wait_until(condition, timeout: float = 60.0) -> None:
    """Wait for a condition another thread brings about (not for a fixed time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_writes_waiting_for_the_disk_stay_within_the_ram_budget(smol_engine, tmp_path, held_writes):
    """A disk slower than the saves: the states queued for it count against the RAM budget,
    shared with the RAM tier (one array), and the oldest waiting ones are dropped, not the
    newest."""
    ctx = smol_engine._ctx
    diagnostics(smol_engine).reset()
    tokens = diagnostics(smol_engine).tokens_for([ChatMessage("user", "Tell me about rivers. " * 20)])[:96]
    settings = CheckpointSettings(ram_budget_mib=2, disk_budget_gib=1.0)
    ck = Checkpoints(settings, fingerprint=FP, ctx=ctx, hybrid=False, root=tmp_path)
    tracemalloc.start()
    try:
        base = _traced()
        ctx.decode(tokens[:8])
        ck.save(ctx, tokens[:8])
        wait_until(lambda: ck.disk.pending()[0].started)  # the writer holds it, at the gate
        one = ck.ram.used
        assert 0 < _traced() - base < 1.5 * one  # RAM entry and queued write share one array
        sizes = [one]
        for n in range(16, len(tokens) + 1, 8):
            ctx.decode(tokens[n - 8 : n])
            sizes.append(ck.save(ctx, tokens[:n])[1])
            # The budget, plus at most the write in progress and the newest state.
            assert _traced() - base <= settings.ram_budget_mib * 2**20 + sizes[0] + sizes[-1] + 256 * 1024
        assert sum(sizes) > 3 * settings.ram_budget_mib * 2**20  # the bound did matter
    finally:
        tracemalloc.stop()
    warnings = ck.take_warnings()
    assert warnings and all("dropped before it reached the disk" in w for w in warnings)
    held_writes.set()
    assert ck.close(timeout=120)
    on_disk = {cf.read_header(f)[0].n_tokens for f in tmp_path.glob(f"*/*{cf.SUFFIX}")}
    assert {8, len(tokens)} <= on_disk  # the one in progress and the newest were kept
    assert len(on_disk) < len(sizes)
    diagnostics(smol_engine).reset()


def test_close_gives_up_on_a_stuck_disk_within_its_timeout(
    smol_engine, tmp_path, held_writes, monkeypatch, caplog
):
    from velo_chat.engine.checkpoints import tiers as checkpoint_tiers

    monkeypatch.setattr(checkpoint_tiers, "ABANDON_GRACE_S", 0.1)
    ctx = smol_engine._ctx
    diagnostics(smol_engine).reset()
    tokens = diagnostics(smol_engine).tokens_for([ChatMessage("user", "Name two colours.")])
    settings = CheckpointSettings(disk_budget_gib=1.0, close_timeout_s=0.5)
    ck = Checkpoints(settings, fingerprint=FP, ctx=ctx, hybrid=False, root=tmp_path)
    ctx.decode(tokens)
    ck.save(ctx, tokens)
    ctx.decode(tokens[:1])
    ck.save(ctx, tokens + tokens[:1])  # two writes: one in progress, one waiting
    writer = ck.disk._writer
    caplog.set_level(logging.INFO, logger="velo_chat.engine.checkpoints.tiers")
    t0 = time.monotonic()
    assert ck.close() is False
    assert time.monotonic() - t0 < 5
    assert any("abandoned 2 checkpoint write(s)" in r.getMessage() for r in caplog.records)
    held_writes.set()  # the disk comes back: the write in progress stops, leaving nothing
    writer.join(60)
    assert not writer.is_alive()
    assert list(tmp_path.glob("*/*")) == []
    diagnostics(smol_engine).reset()


def test_an_abandoned_write_leaves_no_partial_file(tmp_path, monkeypatch, caplog):
    """close() runs out of time in the middle of writing a payload: the writer stops at its
    next chunk and the temp file is removed."""
    from velo_chat.engine.checkpoints import tiers as checkpoint_tiers

    monkeypatch.setattr(checkpoint_tiers, "ABANDON_GRACE_S", 0.1)
    monkeypatch.setattr(cf, "WRITE_CHUNK", 1 << 20)
    tier = _disk_tier(tmp_path)
    reached, gate = threading.Event(), threading.Event()
    should_stop = tier._should_stop

    def stop_mid_write() -> bool:
        if list(tier.dir.glob(".*.tmp")):
            reached.set()
            gate.wait(60)
        return should_stop()

    tier._should_stop = stop_mid_write
    tier.save("a" * 32, ckpt_tokens(40), state(4 << 20))
    assert reached.wait(60)
    caplog.set_level(logging.INFO, logger="velo_chat.engine.checkpoints.tiers")
    assert tier.close(0.3, progress_every=0.05) is False
    assert any("waiting for 1 checkpoint write(s)" in r.getMessage() for r in caplog.records)
    assert list(tier.dir.glob(".*.tmp"))  # still mid-write
    gate.set()
    tier._writer.join(60)
    assert list(tier.dir.iterdir()) == []
    assert any("abandoned the checkpoint write" in r.getMessage() for r in caplog.records)
