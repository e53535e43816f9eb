"""The livelock guard: where the GPU shares the RAM (a DGX Spark's GB10), a load that would leave
less than the margin available is refused (the engine's check and the CLI, exit 2) with the
arithmetic and what to change, and the checkpoints' RAM tier asks before it grows.

The machine is faked where the fit code reads it: /proc/meminfo through `machine.MEMINFO` (or
the guard's own path), the GPU through a fake `nvidia-smi` on PATH that says GB10. The model is
the real SmolLM2, and its check is the real one."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from velo_chat.engine import DoesNotFit
from velo_chat.engine.checkpoints.ram_tier import RamTier
from velo_chat.engine.config import locations
from velo_chat.engine.engine import Engine
from velo_chat.engine.fit import machine, memory_guard, report
from velo_chat.engine.fit.memory_guard import MemoryGuard

from tests.support.engine_helpers import test_profile

GIB, MIB = 1 << 30, 1 << 20

FAKE_SMI = """#!/bin/sh
case "$*" in
  *clocks*) echo "NVIDIA GB10, 2100, 3003, 2200" ;;
  *) echo "NVIDIA GB10, [N/A], [N/A], 580.95.05" ;;
esac
"""


def _meminfo(path: Path, *, total: int, available: int) -> Path:
    path.write_text(
        f"MemTotal:       {total // 1024} kB\nMemFree:        {available // 1024} kB\n"
        f"MemAvailable:   {available // 1024} kB\nCached:         0 kB\n"
        "SwapTotal:      0 kB\nSwapFree:       0 kB\n"
    )
    return path


@pytest.fixture
def gb10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `nvidia-smi` that reports a GB10 (no memory of its own), first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    memory_guard.machine_guard.cache_clear()
    yield bin_dir
    memory_guard.machine_guard.cache_clear()


@pytest.fixture
def fake_meminfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "meminfo"
    monkeypatch.setattr(machine, "MEMINFO", path)
    return path


def test_the_margin_is_4_gib_or_5_percent_of_ram_where_the_gpu_shares_it() -> None:
    assert machine.margin_bytes(16 * GIB) == 4 * GIB
    assert machine.margin_bytes(128 * GIB) == 128 * GIB // 20
    mem = machine.MemInfo(total=128 * GIB, available=100 * GIB, swap_total=0, swap_free=0, cached=0)
    spark = machine.Gpu("NVIDIA GB10", None, None, "580.95.05", integrated=True)
    h100 = machine.Gpu("NVIDIA H100 80GB HBM3", 80 * GIB, 79 * GIB, "580.95.05", integrated=False)
    assert machine.Machine(mem, gpu_offload=True, gpu=spark).margin == 128 * GIB // 20
    assert machine.Machine(mem, gpu_offload=False, gpu=spark).margin == 128 * GIB // 20  # a CPU build too
    assert machine.Machine(mem, gpu_offload=True, gpu=h100).margin == 0
    assert machine.Machine(mem, gpu_offload=False, gpu=None).margin == 0


def test_probe_finds_the_shared_gpu_and_reads_an_injected_meminfo(gb10: Path, tmp_path: Path) -> None:
    found = machine.probe(_meminfo(tmp_path / "mi", total=16 * GIB, available=9 * GIB))
    assert found.mem.available == 9 * GIB and found.shared_with_gpu and found.margin == 4 * GIB


def _needed(smollm2_path: Path, **sections: dict) -> int:
    """What the test profile needs in RAM from the real check, on the machine the fake
    `nvidia-smi` makes this one (a GB10: the GPU's buffers are RAM too) with plenty free and
    this build's llama.cpp (a CUDA build also counts the GPU's compute buffers and runtime)."""
    mem = machine.MemInfo(total=64 * GIB, available=32 * GIB, swap_total=0, swap_free=0, cached=0)
    gb10 = machine.Gpu("NVIDIA GB10", None, None, "580.95.05", integrated=True)
    here = machine.Machine(mem, machine.llama_gpu_offload(), gb10)
    roomy = report.check(test_profile(smollm2_path, **sections), smollm2_path, here)
    assert roomy.fits and roomy.margin == machine.margin_bytes(64 * GIB)
    return roomy.ram_needed


def test_a_load_that_would_leave_less_than_the_margin_is_refused(
    smollm2_path: Path, gb10: Path, fake_meminfo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needed = _needed(smollm2_path)
    # enough for the model and 2 GiB more: it fits, but leaves less than the 4 GiB margin
    available = (needed + 2 * GIB) // 1024 * 1024  # /proc/meminfo counts kB
    _meminfo(fake_meminfo, total=16 * GIB, available=available)
    with pytest.raises(DoesNotFit) as refused:
        Engine(test_profile(smollm2_path)).check()
    found = refused.value.report
    assert found.margin == 4 * GIB and not found.fits
    assert found.short == needed + 4 * GIB - available and found.short - 2 * GIB < 1024
    message = str(refused.value)
    assert f"needs {report.fmt(needed)} of RAM and 4.00 GiB left free beside it" in message
    assert f"{report.fmt(available)} available now" in message
    assert "close programs to free 2.00 GiB" in message and "context.n_ctx = " in message
    table = found.table()
    assert "  margin  " in table and "max(4 GiB, 5% of RAM) to stay available" in table
    assert found.to_json()["margin"] == 4 * GIB

    # the same memory without a GPU sharing it: no margin, so it fits
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
    Engine(test_profile(smollm2_path)).check()


def test_each_suggestion_on_a_shared_machine_is_enough_on_its_own(smollm2_path: Path) -> None:
    mem = machine.MemInfo(total=16 * GIB, available=8 * GIB, swap_total=0, swap_free=0, cached=0)
    spark = machine.Machine(mem, False, machine.Gpu("NVIDIA GB10", None, None, "580", integrated=True))
    profile = test_profile(smollm2_path, context={"n_ctx": 65536}, checkpoints={"ram_budget_mib": 1024})
    refused = report.check(profile, smollm2_path, spark)
    assert not refused.fits and refused.suggestions[0].startswith("close programs to free ")
    freed = dataclasses.replace(spark, mem=dataclasses.replace(mem, available=mem.available + refused.short))
    assert report.check(profile, smollm2_path, freed).fits
    assert len(refused.suggestions) > 1
    for suggestion in refused.suggestions[1:]:
        changed = profile
        for part in suggestion.split(" and "):
            key, _, value = part.partition(" = ")
            section, name = key.split(".")
            typed = int(value) if value.isdigit() else value.strip('"')
            changed = dataclasses.replace(
                changed, **{section: dataclasses.replace(getattr(changed, section), **{name: typed})}
            )
        assert report.check(changed, smollm2_path, spark).fits, suggestion


def test_the_cli_refuses_it_with_the_arithmetic_and_exit_2(
    smollm2_path: Path, gb10: Path, fake_meminfo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from velo_chat.app import cli

    # the profile below: the test profile on the CPU (no n_gpu_layers), as on any machine
    needed = _needed(smollm2_path, model={"n_gpu_layers": 0})
    _meminfo(fake_meminfo, total=16 * GIB, available=needed + 1 * GIB)
    folder = locations.user_profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "small.toml").write_text(
        f'[model]\npath = "{smollm2_path}"\n[context]\nn_ctx = 2048\nn_batch = 256\nn_ubatch = 64\n'
        "n_threads = 2\nadapt_threads = false\n[checkpoints]\nmin_prefill_tokens = 0\n",
        encoding="utf-8",
    )
    handlers = list(logging.getLogger("velo_chat").handlers)
    try:
        rc = cli.main(["ask", "--profile", "small", "hello"])
    finally:
        for handler in set(logging.getLogger("velo_chat").handlers) - set(handlers):
            logging.getLogger("velo_chat").removeHandler(handler)
            handler.close()
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "verdict: does not fit" in err and "max(4 GiB, 5% of RAM) to stay available" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("velo-chat: error: the model does not fit in memory"), last
    assert "4.00 GiB left free beside it" in last and "close programs to free 3.00 GiB" in last


# -- the RAM tier -----------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _state(mib: int) -> np.ndarray:
    return np.zeros(mib * MIB, dtype=np.uint8)


def _tier(path: Path, available: int, clock: _Clock) -> RamTier:
    _meminfo(path, total=128 * GIB, available=available)
    return RamTier(1 * GIB, guard=MemoryGuard(4 * GIB, meminfo_path=path, clock=clock))


def _put(tier: RamTier, key: str, mib: int) -> bool:
    return tier.put(key, np.arange(mib, dtype=np.int32), _state(mib))


def test_the_ram_tier_drops_its_oldest_states_rather_than_cross_the_margin(tmp_path: Path, caplog) -> None:
    clock = _Clock()
    tier = _tier(tmp_path / "mi", 4 * GIB + 3 * MIB, clock)
    assert _put(tier, "a", 1) and _put(tier, "b", 1)  # 1 MiB left above the margin
    with caplog.at_level(logging.INFO, logger="velo_chat.engine.fit.memory_guard"):
        assert _put(tier, "c", 2)  # dropping "a" is enough: "b" stays
    assert list(tier.entries) == ["b", "c"] and tier.used == 3 * MIB
    assert any("dropped 1 older checkpoint" in r.getMessage() for r in caplog.records)


def test_the_ram_tier_skips_a_save_that_nothing_it_holds_would_make_room_for(tmp_path: Path, caplog) -> None:
    clock = _Clock()
    tier = _tier(tmp_path / "mi", 4 * GIB + 3 * MIB, clock)
    assert _put(tier, "a", 1)
    with caplog.at_level(logging.WARNING, logger="velo_chat.engine.fit.memory_guard"):
        assert not _put(tier, "big", 8)  # 8 MiB > the 3 MiB above the margin, even without "a"
    assert list(tier.entries) == ["a"] and tier.used == 1 * MIB  # nothing dropped for nothing
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "8.00 MiB was not kept in RAM" in warning and "4.00 GiB must stay free" in warning
    assert "checkpoints.ram_budget_mib" in warning


def test_the_guard_reads_meminfo_at_most_once_a_second(tmp_path: Path) -> None:
    clock = _Clock()
    path = tmp_path / "mi"
    tier = _tier(path, 4 * GIB + 2 * MIB, clock)
    assert _put(tier, "a", 1)
    _meminfo(path, total=128 * GIB, available=8 * GIB)  # memory freed elsewhere ...
    clock.now += 0.5
    assert not _put(tier, "b", 3)  # ... not read yet: 1 MiB left above the margin, as counted
    clock.now += 0.5
    assert _put(tier, "b", 3) and list(tier.entries) == ["a", "b"]  # read again after a second
    _meminfo(path, total=128 * GIB, available=4 * GIB - 10 * MIB)  # taken again: below the margin
    clock.now += 1.0
    assert not _put(tier, "c", 1) and list(tier.entries) == ["a", "b"]


def test_without_a_shared_gpu_the_tier_has_no_guard() -> None:
    memory_guard.machine_guard.cache_clear()
    try:
        assert RamTier(1 * GIB).guard is None  # this machine: no GB10
    finally:
        memory_guard.machine_guard.cache_clear()


def test_with_a_shared_gpu_the_tier_gets_this_machines_guard(gb10: Path, fake_meminfo: Path) -> None:
    _meminfo(fake_meminfo, total=128 * GIB, available=64 * GIB)
    guard = RamTier(1 * GIB).guard
    assert guard is not None and guard.margin == 128 * GIB // 20 and guard.allows(1 * GIB)


def test_a_save_with_memory_to_spare_does_not_count_what_the_tier_holds(tmp_path: Path, monkeypatch) -> None:
    """What each held state would free is a pass over every chunked entry's chunks, on the
    turn's thread: the guard asks for it only when memory is short, not at every save."""
    from velo_chat.engine.checkpoints import chunks as ch

    clock = _Clock()
    tier = _tier(tmp_path / "mi", 64 * GIB, clock)  # plenty above the 4 GiB margin
    for key in ("a", "b"):
        state = _state(1)
        assert tier.put(key, np.arange(1, dtype=np.int32), state)
        tier.adopt(key, ch.split(state))
    counted: list[object] = []
    monkeypatch.setattr(tier.pool, "only_in", lambda state: counted.append(state) or 0)
    assert _put(tier, "c", 1)
    assert not counted
    _meminfo(tmp_path / "mi", total=128 * GIB, available=4 * GIB + 1 * MIB)  # now it is short
    clock.now += 1.0  # the guard reads /proc/meminfo again
    assert _put(tier, "d", 2)
    assert counted  # asked what the chunked entries would free, then dropped the oldest
