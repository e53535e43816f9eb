"""Chunked checkpoints (format 3): a later save writes only what changed, a restore checks every
chunk, a damaged shared chunk makes every checkpoint that lists it unusable, eviction never
removes a pack a kept checkpoint needs, and format-2 files still restore. Real files in
tmp_path; states are random bytes laid out like a KV cache that grows per layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from velo_chat.engine.checkpoints import chunks as ch
from velo_chat.engine.checkpoints import file_format as cf
from velo_chat.engine.checkpoints.tiers import DiskTier

FP = "f" * 64
LAYOUT = {"k": 1}
ROW = 384  # bytes of one cell in one layer's block
LAYERS = 6


def kv_state(cells: np.ndarray) -> np.ndarray:
    """A state whose layer blocks each hold `cells` rows: a longer context shares every
    shorter one's rows, at other offsets (each block grows)."""
    return np.concatenate([cells[:, layer].reshape(-1) for layer in range(LAYERS)])


def cells(n: int) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, size=(n, LAYERS, ROW), dtype=np.uint8)[:n]


def tier(root: Path, warnings: list[str] | None = None, budget: int = 2**30, **kw) -> DiskTier:
    return DiskTier(root, FP, LAYOUT, budget, (warnings if warnings is not None else []).append, **kw)


def restored(t: DiskTier, name: str) -> bytes | None:
    payload = t.open_payload(t.entries[name])
    if payload is None:
        return None
    with payload:
        return bytes(payload.view)


def test_the_chunks_of_a_longer_context_are_mostly_shared():
    all_cells = cells(1200)
    short, long = kv_state(all_cells[:1000]), kv_state(all_cells[:1200])
    pool: dict[bytes, np.ndarray] = {}
    ch.split(short, pool)
    known = set(pool)
    longer = ch.split(long, pool)
    assert bytes(longer.assemble()) == long.tobytes()
    assert ch.new_bytes(longer, known) < 0.35 * len(long)  # 1/6 of it is new, plus the seams


def test_a_follow_up_writes_only_what_changed_and_restores_whole(tmp_path):
    all_cells = cells(1200)
    t = tier(tmp_path)
    t.save("one", np.arange(1000, dtype=np.int32), kv_state(all_cells[:1000]))
    assert t.flush(60)
    assert t.last_write is not None and t.last_write.written_bytes >= t.last_write.state_bytes
    long = kv_state(all_cells[:1200])
    t.save("two", np.arange(1200, dtype=np.int32), long)
    assert t.flush(60)
    assert t.last_write.written_bytes < 0.35 * len(long)
    t.close()
    again = tier(tmp_path)
    assert restored(again, "two") == long.tobytes()
    again.close()


def test_a_damaged_shared_chunk_discards_every_checkpoint_that_lists_it(tmp_path):
    all_cells = cells(1200)
    warnings: list[str] = []
    t = tier(tmp_path, warnings)
    t.save("one", np.arange(1000, dtype=np.int32), kv_state(all_cells[:1000]))
    t.save("two", np.arange(1200, dtype=np.int32), kv_state(all_cells[:1200]))
    assert t.flush(60)
    one, two = t.entries["one"].table, t.entries["two"].table
    shared = set(cf.digests_of(one)) & set(cf.digests_of(two))
    i = next(i for i, d in enumerate(cf.digests_of(two)) if d in shared)
    pack = cf.pack_path(t.dir, cf.packs_of(two)[i])
    offset = int(two["offset"][i])
    data = bytearray(pack.read_bytes())
    data[offset] ^= 0xFF
    pack.write_bytes(bytes(data))
    assert restored(t, "two") is None
    assert set(t.entries) == set()  # "one" lists the chunk too: unusable as well
    assert sum("discarded checkpoint" in w for w in warnings) == 2
    # the next save writes that chunk again instead of sharing the damaged copy
    state = kv_state(all_cells[:1000])
    t.save("three", np.arange(1000, dtype=np.int32), state)
    assert t.flush(60)
    assert restored(t, "three") == state.tobytes()
    t.close()


def test_eviction_never_removes_a_pack_a_kept_checkpoint_needs(tmp_path):
    """Five branches of one conversation: each shares the first 1000 cells and adds 300 of
    its own. The budget holds any one whole, not all of them: older ones are evicted, while
    the pack of the shared cells stays as long as a kept checkpoint lists them."""
    shared = cells(1000)
    branches = [
        np.concatenate(
            [shared, np.random.default_rng(100 + i).integers(0, 256, (300, LAYERS, ROW), dtype=np.uint8)]
        )
        for i in range(5)
    ]
    budget = int(1.6 * len(kv_state(shared)))
    t = tier(tmp_path, budget=budget)
    for i, branch in enumerate(branches):
        t.save(f"s{i}", np.arange(1300, dtype=np.int32) + 10_000 * i, kv_state(branch))
        assert t.flush(60)
        assert sum(f.stat().st_size for f in t.dir.iterdir()) <= budget
    kept = sorted(t.entries)
    assert kept and "s0" not in kept  # the least recently used went first
    for name in kept:
        assert restored(t, name) == kv_state(branches[int(name[1])]).tobytes()  # all its packs are there
    t.close()


def test_format_2_files_still_restore_and_orphan_packs_are_collected(tmp_path):
    old = np.frombuffer(np.random.default_rng(3).bytes(300_000), dtype=np.uint8)
    t = tier(tmp_path, chunked=False)
    t.save("old", np.arange(50, dtype=np.int32), old)
    assert t.flush(60)
    t.close()
    orphan = t.dir / f"{'ab' * 16}-999999999{cf.PACK_SUFFIX}"  # a killed writer's, never listed
    orphan.write_bytes(b"x" * 100)
    again = tier(tmp_path)
    assert not orphan.exists()
    assert again.entries["old"].table is None and restored(again, "old") == old.tobytes()
    again.close()


def _rewrite_header(t: DiskTier, name: str, **changes) -> None:
    """Write checkpoint `name` again with some header fields changed (its packs kept)."""
    entry = t.entries[name]
    header = cf.CheckpointHeader(**{**vars(entry.header), **changes})
    cf.write_manifest(t.dir, name, header, entry.tokens, entry.table)


def test_a_restore_checks_the_whole_state_digest_and_reads_files_without_one(tmp_path):
    all_cells = cells(1000)
    state = kv_state(all_cells)
    t = tier(tmp_path)
    t.save("one", np.arange(1000, dtype=np.int32), state)
    assert t.flush(60)
    assert t.entries["one"].header.state_sha256 == cf.payload_digest(state)
    t.close()
    # a file written before the whole-state digest: checked chunk by chunk, and restored
    old = tier(tmp_path)
    _rewrite_header(old, "one", state_sha256="")
    old.close()
    again = tier(tmp_path)
    assert again.entries["one"].header.state_sha256 == ""
    assert restored(again, "one") == state.tobytes()
    again.close()


def test_a_state_digest_that_no_chunk_explains_discards_only_that_checkpoint(tmp_path):
    all_cells = cells(1200)
    warnings: list[str] = []
    t = tier(tmp_path, warnings)
    t.save("one", np.arange(1000, dtype=np.int32), kv_state(all_cells[:1000]))
    t.save("two", np.arange(1200, dtype=np.int32), kv_state(all_cells[:1200]))
    assert t.flush(60)
    _rewrite_header(t, "two", state_sha256="sha256-16MiB:" + "0" * 64)
    t.close()
    t = tier(tmp_path, warnings)
    assert restored(t, "two") is None
    assert set(t.entries) == {"one"}  # its chunks are sound: the checkpoint that shares them stays
    assert any("the state, not a chunk" in w for w in warnings)
    assert restored(t, "one") == kv_state(all_cells[:1000]).tobytes()
    t.close()


def test_a_pack_whose_id_ends_in_nul_bytes_is_found(tmp_path, monkeypatch):
    """Pack ids are 16 random bytes, and numpy drops an `S` field's trailing NULs: one pack in
    256 ends in one. Such a pack must still be read (its file name has the whole id)."""
    import os as os_module

    ids = iter([b"\x5a" * 14 + b"\x00\x00", b"\x11" * 15 + b"\x00"])
    real = os_module.urandom
    monkeypatch.setattr(os_module, "urandom", lambda n: next(ids) if n == 16 else real(n))
    all_cells = cells(1200)
    t = tier(tmp_path)
    t.save("one", np.arange(1000, dtype=np.int32), kv_state(all_cells[:1000]))
    t.save("two", np.arange(1200, dtype=np.int32), kv_state(all_cells[:1200]))
    assert t.flush(60)
    assert {p.name.split("-")[0][-4:] for p in t.dir.glob(f"*{cf.PACK_SUFFIX}")} == {"0000", "1100"}
    assert restored(t, "two") == kv_state(all_cells[:1200]).tobytes()
    assert restored(t, "one") == kv_state(all_cells[:1000]).tobytes()
    t.close()


def test_the_whole_state_digest_is_hashed_while_the_packs_are_read(tmp_path, monkeypatch):
    """A state of several 16 MiB blocks, its chunks in two packs: each block is hashed as soon
    as its last byte is in, whatever order the packs deliver them in and however the reads cut
    across the blocks, and the restore gives the state back byte for byte."""
    from velo_chat.engine.checkpoints import chunked_read

    all_cells = cells(20_000)  # 6 layers x 384 B a cell: 46 MB at the end, 3 blocks
    t = tier(tmp_path, budget=2**31)
    t.save("one", np.arange(16_000, dtype=np.int32), kv_state(all_cells[:16_000]))
    long = kv_state(all_cells)
    t.save("two", np.arange(20_000, dtype=np.int32), long)
    assert t.flush(120)
    t.close()
    whole_again = []
    monkeypatch.setattr(cf, "payload_digest", lambda *a, **k: whole_again.append(1))
    again = tier(tmp_path)
    assert len({run.pack for run in chunked_read._runs(again.entries["two"].table)}) == 2
    assert restored(again, "two") == long.tobytes()
    assert not whole_again  # no second pass over the state after the reads
    again.close()
