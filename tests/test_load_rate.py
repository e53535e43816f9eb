"""The load's speed and time left (CLI progress line, TUI live panel): a split model's size from
its shard names, and the rate from llama.cpp's progress fraction on a fixed clock."""

from __future__ import annotations

from pathlib import Path

from velo_chat.app.load_rate import LoadRate, model_bytes


def test_a_split_model_counts_every_shard_and_a_missing_one_gives_none(tmp_path: Path):
    for i, size in enumerate((1000, 2000, 3000), start=1):
        (tmp_path / f"m-{i:05d}-of-00003.gguf").write_bytes(b"x" * size)
    assert model_bytes(tmp_path / "m-00001-of-00003.gguf") == 6000
    (tmp_path / "m-00002-of-00003.gguf").unlink()
    assert model_bytes(tmp_path / "m-00001-of-00003.gguf") is None
    (tmp_path / "one.gguf").write_bytes(b"x" * 123)
    assert model_bytes(tmp_path / "one.gguf") == 123


def test_the_rate_and_time_left_follow_the_fraction():
    now = [100.0]
    rate = LoadRate(10_000_000_000, clock=lambda: now[0])
    unknown_size = LoadRate(None, clock=lambda: now[0])
    now[0] = 100.2
    assert rate.text(0.1) == ""  # too early to say
    now[0] = 102.0
    assert rate.text(0.25) == "1.25 GB/s · 6 s left"
    now[0] = 110.0
    assert rate.text(0.05) == "0.05 GB/s · 3 min left"
    assert rate.text(1.0) == ""
    assert unknown_size.text(0.5) == "10 s left"
